"""Actor-critic MLPs, one per policy: categorical heads for multi-discrete actions,
a tanh-squashed Gaussian head for continuous (Box) ones.

Both share one interface, so the learner treats them alike:
- acting (training.actors): discrete, `log_probs(obs, mask)` (every choice's
  log-probability side by side, drawn afterwards by gpusim's sampler kernel);
  Gaussian, `sample(obs, deterministic)` (raw action, its log-probability,
  the env's action), drawn here with torch's RNG;
- `value(critic_obs)` for rollouts (the critic's input may be a global state);
- `forward(obs, actions, mask, critic_obs)` for updates: (log-prob of
  `actions`, entropy, value).
What a rollout stores as the action is what `forward` takes back: the choice
indices, or the Gaussian's raw (pre-tanh) sample, whose log-probability
needs no inverse tanh (unstable at the bounds).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# On the CPU torch's tanh runs at about 2.6 ns per element, its sigmoid at 0.4, so
# 2 sigmoid(2x) - 1 is faster above these many elements (benchmarks/calibrations/activations.py):
# without autograd from about 8k elements (2x at 128k); with it (a Python backward node)
# from about 64k (1.4x at 256k).
SIGMOID_TANH_MIN_ELEMENTS = 8192
SIGMOID_TANH_MIN_ELEMENTS_GRAD = 65536


class _SigmoidTanh(torch.autograd.Function):
    """tanh as 2 sigmoid(2x) - 1, with tanh's own backward on the output."""
    generate_vmap_rule = True  # a population's members run it under torch.func.vmap

    @staticmethod
    def forward(x):
        return _sigmoid_tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def _sigmoid_tanh(x):
    return torch.mul(x, 2).sigmoid_().mul_(2).sub_(1)


def tanh(x):
    """tanh, in the form that runs fastest where it runs: under torch.compile
    1 - 2 / (exp(2x) + 1), which inductor's CPU loops vectorise; eagerly on the CPU, for
    large inputs, 2 sigmoid(2x) - 1. Every form agrees with tanh within 2e-7
    (tests/training/test_fused.py)."""
    if torch.compiler.is_compiling():
        return 1 - 2 / (torch.exp(2 * x) + 1)
    # where gradients are recorded the output is kept for the backward: no in-place form
    # (asked of the mode, not of `x`: under vmap a batched `x` does not say it needs them)
    grad = torch.is_grad_enabled()
    smallest = SIGMOID_TANH_MIN_ELEMENTS_GRAD if grad else SIGMOID_TANH_MIN_ELEMENTS
    if x.device.type != "cpu" or x.numel() < smallest:  # (under vmap: one member's)
        return torch.tanh(x)
    return _SigmoidTanh.apply(x) if grad else _sigmoid_tanh(x)


class Tanh(nn.Module):
    def forward(self, x):
        return tanh(x)


ACTIVATIONS = {"tanh": Tanh, "relu": nn.ReLU}
ACTIVATION_FNS = {Tanh: tanh, nn.ReLU: torch.relu}
LOG_STD_RANGE = (-5.0, 2.0)  # a state-dependent log-std is clamped here


class MLP(nn.Sequential):
    """Linear layers with activations between them; the forward calls the layers'
    functions directly (at rollout sizes, module calls cost more than the layers)."""

    def forward(self, x):
        for layer in self:
            if isinstance(layer, nn.Linear):
                x = linear(x, layer.weight, layer.bias)
            else:
                x = ACTIVATION_FNS[type(layer)](x)
        return x


def linear(x, weight, bias):
    """F.linear; with a population's stacked weights (members, out, in) and biases
    (members, out), every member's layer on its own rows x (members, ..., in) as one
    batched product (training.population.members.StackedPolicy)."""
    if weight.dim() == 2:
        return F.linear(x, weight, bias)
    rows = x.reshape(x.shape[0], -1, x.shape[-1])
    out = torch.baddbmm(bias.unsqueeze(1), rows, weight.transpose(1, 2))
    return out.reshape(x.shape[:-1] + (weight.shape[1],))


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
    return MLP(*layers)


def training_bytes(spec, policy_config, networks: int) -> int:
    """About what `networks` MLPs of a policy take while training (weights, gradients and
    Adam's two moments, fp32), estimated before allocating any."""
    hidden = list(policy_config.hidden_sizes)
    sizes = [spec.obs_dim + spec.action_width] + hidden + [2 * spec.action_width + 1]
    params = sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))
    if policy_config.recurrent != "none":
        params += 8 * (hidden[-1] + policy_config.recurrent_size + 1) \
            * policy_config.recurrent_size
    return networks * params * 4 * 4


def tanh_gaussian_log_prob(mean, log_std, raw) -> torch.Tensor:
    """log-density of tanh(raw), raw ~ N(mean, exp(log_std)), summed over the last dim:
    the Gaussian's minus log(1 - tanh(raw)^2), written 2 (log 2 - u - softplus(-2u)) so it
    stays finite for large |u|."""
    gaussian = -0.5 * ((raw - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    log_det = 2 * (math.log(2.0) - raw - F.softplus(-2 * raw))
    return (gaussian - log_det).sum(-1)


def make_model(spec, policy_config, critic_dim: int | None = None) -> nn.Module:
    """The actor-critic of one policy (a gpusim.spaces.PolicySpec) under the `policy`
    config; `critic_dim`: the critic's input size where it is not the observation's."""
    hidden, activation = policy_config.hidden_sizes, policy_config.activation
    if policy_config.recurrent != "none":
        return RecurrentActorCritic(spec, policy_config)
    if spec.continuous:
        return GaussianActorCritic(spec.obs_dim, spec.actions.low, spec.actions.high, hidden,
                                   activation, policy_config.state_dependent_std,
                                   policy_config.log_std_init, critic_dim)
    return ActorCritic(spec.obs_dim, spec.actions, hidden, activation, critic_dim)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs; the actor's logits are split per action component."""
    state_size = 0  # no recurrent state (RecurrentActorCritic has one)
    members_lead = True  # its methods take a population's leading member dim as it is

    def __init__(self, obs_dim: int, action_nvec, hidden_sizes, activation="tanh",
                 critic_dim: int | None = None):
        super().__init__()
        hidden = list(hidden_sizes)
        self.action_nvec = tuple(int(n) for n in action_nvec)
        self.actor = mlp([obs_dim] + hidden + [sum(self.action_nvec)], activation, 0.01)
        self.critic = mlp([critic_dim or obs_dim] + hidden + [1], activation, 1.0)

    def value(self, critic_obs: torch.Tensor) -> torch.Tensor:
        return self.critic(critic_obs).squeeze(-1).float()

    def component_log_probs(self, obs: torch.Tensor, mask=None) -> list:
        """Per component, log-probabilities over its choices (fp32 under autocast too);
        masked choices (mask False) get -inf."""
        logits = self.actor(obs).float()
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        if len(self.action_nvec) == 1:  # no split to make (a split and a cat cost 5 us)
            return [torch.log_softmax(logits, dim=-1)]
        return [torch.log_softmax(part, dim=-1)
                for part in torch.split(logits, self.action_nvec, dim=-1)]

    def log_probs(self, obs: torch.Tensor, mask=None) -> torch.Tensor:
        """Acting (training.actors): every component's log-probabilities side by side."""
        parts = self.component_log_probs(obs, mask)
        return parts[0] if len(parts) == 1 else torch.cat(parts, -1)

    def forward(self, obs, actions, mask=None, critic_obs=None):
        """The training pass: (log-prob of `actions` summed over components, entropy over
        the legal choices, value of `critic_obs` (default: `obs`))."""
        log_probs = self.component_log_probs(obs, mask)
        chosen = sum(lp.gather(-1, actions[..., c:c + 1].long()).squeeze(-1)
                     for c, lp in enumerate(log_probs))
        entropy = sum(-(lp.exp() * lp.clamp_min(torch.finfo(lp.dtype).min)).sum(-1)
                      for lp in log_probs)  # a masked choice adds 0 * finite, not 0 * -inf
        return chosen, entropy, self.value(obs if critic_obs is None else critic_obs)


class GaussianActorCritic(nn.Module):
    """A Gaussian over raw actions u, squashed into the bounds: a = center + half_range * tanh(u).

    The log-std is one learned parameter per dimension (state-independent), or
    a second output of the actor (state-dependent, clamped to LOG_STD_RANGE).
    The log-probability is that of the env's action a: the Gaussian's, minus
    log|da/du| = log(half_range) + log(1 - tanh(u)^2) per dimension. The entropy is
    the Gaussian's (that of the squashed one has no closed form).
    """
    state_size = 0
    members_lead = True  # (as ActorCritic's; its own parameters broadcast per member)

    def __init__(self, obs_dim: int, low, high, hidden_sizes, activation="tanh",
                 state_dependent_std: bool = False, log_std_init: float = 0.0,
                 critic_dim: int | None = None):
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
        self.critic = mlp([critic_dim or obs_dim] + hidden + [1], activation, 1.0)

    def value(self, critic_obs: torch.Tensor) -> torch.Tensor:
        return self.critic(critic_obs).squeeze(-1).float()

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
        return tanh_gaussian_log_prob(mean, log_std, raw) - torch.log(self.half_range).sum(-1)

    def sample(self, obs: torch.Tensor, deterministic: bool = False, noise=None):
        """Acting (training.actors): (raw action, its log-prob, the env's action
        `squash(raw)`). Deterministic: the mean. `noise`: the standard normal draws to use
        (default: drawn here from torch's generator)."""
        mean, log_std = self.distribution(obs)
        if not deterministic and noise is None:
            noise = torch.randn_like(mean)
        raw = mean if deterministic else mean + log_std.exp() * noise
        return raw, self.log_prob(mean, log_std, raw), self.squash(raw)

    def forward(self, obs, actions, mask=None, critic_obs=None):
        """The training pass: (log-prob of raw `actions`, entropy of the Gaussian, value of
        `critic_obs` (default: `obs`)). `mask` is for discrete actions: unused."""
        mean, log_std = self.distribution(obs)
        entropy = (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)
        return (self.log_prob(mean, log_std, actions.float()), entropy,
                self.value(obs if critic_obs is None else critic_obs))


class RecurrentActorCritic(nn.Module):
    """An MLP encoder, a GRU or LSTM cell, and a one-layer head of either kind (discrete or
    Gaussian) on its output; the critic reads the same recurrent features.

    The recurrent state, one per agent, is `state_size` wide (an LSTM's h and c side by
    side). Acting carries it: `log_probs(obs, mask, state)` and `sample(obs,
    deterministic, state)` also return the next state, `value(obs, state)` does not
    advance it. The training pass runs whole sequences: `forward(obs, actions, mask,
    critic_obs, state, resets)` with (sequences, steps, ...) inputs, the state at each
    sequence's start, and where an episode ended before a step (the state restarts at 0).
    """

    def __init__(self, spec, policy_config):
        super().__init__()
        hidden, activation = list(policy_config.hidden_sizes), policy_config.activation
        size = policy_config.recurrent_size
        self.encoder = nn.Sequential(mlp([spec.obs_dim] + hidden, activation, 2 ** 0.5),
                                     ACTIVATIONS[activation]())
        self.lstm = policy_config.recurrent == "lstm"
        cell = nn.LSTMCell if self.lstm else nn.GRUCell
        self.core = cell(hidden[-1], size)
        self.state_size = 2 * size if self.lstm else size
        if spec.continuous:
            self.head = GaussianActorCritic(size, spec.actions.low, spec.actions.high, (),
                                            activation, policy_config.state_dependent_std,
                                            policy_config.log_std_init)
        else:
            self.head = ActorCritic(size, spec.actions, (), activation)

    def features(self, obs, state):
        """(recurrent features, next state) for one step; any leading dims."""
        lead = obs.shape[:-1]
        x = self.encoder(obs).reshape(-1, self.core.input_size)
        flat = state.reshape(-1, self.state_size).to(x.dtype)
        if self.lstm:
            h, c = self.core(x, tuple(flat.chunk(2, -1)))
            nxt = torch.cat([h, c], -1)
        else:
            h = nxt = self.core(x, flat)
        return h.reshape(lead + (-1,)), nxt.float().reshape(lead + (self.state_size,))

    def log_probs(self, obs, mask=None, state=None):
        f, nxt = self.features(obs, state)
        return self.head.log_probs(f, mask), nxt

    def sample(self, obs, deterministic: bool = False, state=None):
        f, nxt = self.features(obs, state)
        return (*self.head.sample(f, deterministic), nxt)

    def value(self, obs, state=None):
        return self.head.value(self.features(obs, state)[0])

    def forward(self, obs, actions, mask=None, critic_obs=None, state=None, resets=None):
        steps = obs.shape[1]
        out = []
        for k in range(steps):
            state = state * (~resets[:, k]).to(state.dtype)[..., None]
            f, state = self.features(obs[:, k], state)
            out.append(f)
        return self.head(torch.stack(out, 1), actions, mask)
