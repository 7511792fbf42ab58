"""Actor-critic MLPs, one per policy: categorical heads for multi-discrete actions,
a tanh-squashed Gaussian head for continuous (Box) ones.

Both share one interface, so the trainer treats them alike:
- `act(obs)` for rollouts: discrete, (log-probabilities of every choice side
  by side, value), sampled afterwards by gpusim's sampler kernel; Gaussian,
  (raw action, its log-probability, value), sampled here with torch's RNG.
- `evaluate(obs, actions)` for updates: (log-prob of `actions`, entropy, value).
What a rollout stores as the action is what `evaluate` takes back: the choice
indices, or the Gaussian's raw (pre-tanh) sample, whose log-probability
needs no inverse tanh (unstable at the bounds).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
LOG_STD_RANGE = (-5.0, 2.0)  # a state-dependent log-std is clamped here


def mlp(sizes, activation, out_gain):
    layers = []
    for k, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        last = k == len(sizes) - 2
        layer = nn.Linear(n_in, n_out)
        nn.init.orthogonal_(layer.weight, out_gain if last else 2 ** 0.5)
        nn.init.zeros_(layer.bias)
        layers.append(layer)
        if not last:
            layers.append(ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


def tanh_gaussian_log_prob(mean, log_std, raw) -> torch.Tensor:
    """log-density of tanh(raw), raw ~ N(mean, exp(log_std)), summed over the last dim:
    the Gaussian's minus log(1 - tanh(raw)^2), written 2 (log 2 - u - softplus(-2u)) so it
    stays finite for large |u|."""
    gaussian = -0.5 * ((raw - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    log_det = 2 * (math.log(2.0) - raw - F.softplus(-2 * raw))
    return (gaussian - log_det).sum(-1)


def make_model(spec, policy_config) -> nn.Module:
    """The model of one policy (a gpusim.spaces.PolicySpec) under the `policy` config."""
    hidden, activation = policy_config.hidden_sizes, policy_config.activation
    if spec.continuous:
        return GaussianActorCritic(spec.obs_dim, spec.actions.low, spec.actions.high, hidden,
                                   activation, policy_config.state_dependent_std,
                                   policy_config.log_std_init)
    return ActorCritic(spec.obs_dim, spec.actions, hidden, activation)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs; the actor's logits are split per action component."""

    def __init__(self, obs_dim: int, action_nvec, hidden_sizes, activation="tanh"):
        super().__init__()
        hidden = list(hidden_sizes)
        self.action_nvec = tuple(int(n) for n in action_nvec)
        self.actor = mlp([obs_dim] + hidden + [sum(self.action_nvec)], activation, 0.01)
        self.critic = mlp([obs_dim] + hidden + [1], activation, 1.0)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1).float()

    def log_probs(self, obs: torch.Tensor) -> list:
        """Per component, log-probabilities over its choices (fp32 under autocast too)."""
        logits = self.actor(obs).float()
        return [torch.log_softmax(part, dim=-1)
                for part in torch.split(logits, self.action_nvec, dim=-1)]

    def act(self, obs: torch.Tensor):
        """What a rollout step needs: (log-probabilities side by side, value)."""
        return torch.cat(self.log_probs(obs), -1), self.value(obs)

    def evaluate(self, obs, actions):
        """(log-prob of `actions`, entropy, value), summed over action components."""
        log_probs = self.log_probs(obs)
        chosen = sum(lp.gather(-1, actions[..., c:c + 1].long()).squeeze(-1)
                     for c, lp in enumerate(log_probs))
        entropy = sum(-(lp.exp() * lp).sum(-1) for lp in log_probs)
        return chosen, entropy, self.value(obs)

    forward = evaluate  # what DistributedDataParallel calls: the training pass


class GaussianActorCritic(nn.Module):
    """A Gaussian over raw actions u, squashed into the bounds: a = center + half_range * tanh(u).

    The log-std is one learned parameter per dimension (state-independent), or
    a second output of the actor (state-dependent, clamped to LOG_STD_RANGE).
    The log-probability is that of the env's action a: the Gaussian's, minus
    log|da/du| = log(half_range) + log(1 - tanh(u)^2) per dimension. The entropy is
    the Gaussian's (that of the squashed one has no closed form).
    """

    def __init__(self, obs_dim: int, low, high, hidden_sizes, activation="tanh",
                 state_dependent_std: bool = False, log_std_init: float = 0.0):
        super().__init__()
        hidden = list(hidden_sizes)
        low, high = torch.tensor(low, dtype=torch.float32), torch.tensor(high, dtype=torch.float32)
        self.register_buffer("center", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)
        self.dim = len(low)
        self.state_dependent_std = state_dependent_std
        width = 2 * self.dim if state_dependent_std else self.dim
        self.actor = mlp([obs_dim] + hidden + [width], activation, 0.01)
        if state_dependent_std:
            with torch.no_grad():
                self.actor[-1].bias[self.dim:] = log_std_init
        else:
            self.log_std = nn.Parameter(torch.full((self.dim,), float(log_std_init)))
        self.critic = mlp([obs_dim] + hidden + [1], activation, 1.0)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1).float()

    def distribution(self, obs: torch.Tensor):
        """(mean, log_std) of the raw action, fp32."""
        out = self.actor(obs).float()
        if self.state_dependent_std:
            mean, log_std = out[..., :self.dim], out[..., self.dim:]
            return mean, log_std.clamp(*LOG_STD_RANGE)
        return out, self.log_std.expand_as(out)

    def squash(self, raw: torch.Tensor) -> torch.Tensor:
        """The env's action for raw action `raw`: inside the bounds."""
        return self.center + self.half_range * torch.tanh(raw)

    def log_prob(self, mean, log_std, raw) -> torch.Tensor:
        """log-density of the env's action center + half_range * tanh(raw)."""
        return tanh_gaussian_log_prob(mean, log_std, raw) - torch.log(self.half_range).sum()

    def act(self, obs: torch.Tensor, deterministic: bool = False):
        """What a rollout step needs: (raw action, its log-prob, value); the env takes
        `squash(raw)`. Deterministic: the mean."""
        mean, log_std = self.distribution(obs)
        raw = mean if deterministic else mean + log_std.exp() * torch.randn_like(mean)
        return raw, self.log_prob(mean, log_std, raw), self.value(obs)

    def evaluate(self, obs, actions):
        """(log-prob of raw `actions`, entropy of the Gaussian, value)."""
        mean, log_std = self.distribution(obs)
        entropy = (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)
        return self.log_prob(mean, log_std, actions.float()), entropy, self.value(obs)

    forward = evaluate
