"""Actor-critic MLPs with multi-discrete categorical heads, one per policy."""
from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


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
