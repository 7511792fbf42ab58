"""The off-policy networks that DDPG, TD3 and SAC share.

`Actor`: obs -> an action in [-1, 1] per dimension (tanh), deterministic or a
squashed-Gaussian sample. `OffPolicyModel`: one policy's actor, critics, their
target copies and SAC's log-alpha, with acting (`sample`, into the env's Box)
and Q on given parameters. `NetsOn`: a group's networks as a gradient step
sees them (offpolicy.py), which the algorithms' hooks take in place of the
group: the actor and critics on the step's parameters, the targets, alpha,
the standard normal draws and the targets' soft update (a population member
runs them on its slices of stacked weights: offpolicy_members.py).
`OffPolicyGroup`: one policy's networks, Adams (`Optimizers`) and replay shard.
"""
from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from ..models import LOG_STD_RANGE, mlp, tanh_gaussian_log_prob


class Actor(nn.Module):
    """obs -> an action in [-1, 1]^dims: deterministic (DDPG, TD3) or a squashed Gaussian
    sample with its log-probability (SAC)."""

    def __init__(self, obs_dim, dims, hidden, activation, stochastic: bool):
        super().__init__()
        self.stochastic = stochastic
        self.net = mlp([obs_dim] + hidden + [2 * dims if stochastic else dims], activation, 0.01)

    def forward(self, obs, deterministic: bool = False, noise=None):
        """`noise`: the sample's standard normal draws (default: torch's own)."""
        out = self.net(obs)
        if not self.stochastic:
            return torch.tanh(out), None
        mean, log_std = out.chunk(2, dim=-1)
        log_std = log_std.clamp(*LOG_STD_RANGE)
        if deterministic:
            raw = mean
        else:
            raw = mean + log_std.exp() * (torch.randn_like(mean) if noise is None else noise)
        return torch.tanh(raw), tanh_gaussian_log_prob(mean, log_std, raw)


class OffPolicyModel(nn.Module):
    """One policy's networks: the actor, its critics and their target copies, and SAC's
    log-alpha; one state_dict for checkpoints."""

    def __init__(self, spec, policy_config, num_critics: int, stochastic: bool,
                 alpha: float | None = None, tune_alpha: bool = False,
                 exploration_noise: float = 0.0):
        super().__init__()
        hidden, activation = list(policy_config.hidden_sizes), policy_config.activation
        dims = spec.action_width
        self.actor = Actor(spec.obs_dim, dims, hidden, activation, stochastic)
        self.critics = nn.ModuleList(mlp([spec.obs_dim + dims] + hidden + [1], activation, 1.0)
                                     for _ in range(num_critics))
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(alpha) if alpha else 0.0),
                                      requires_grad=tune_alpha)
        self.entropy_bonus = stochastic and alpha != 0  # sac_alpha 0: none at all
        low, high = torch.tensor(spec.actions.low), torch.tensor(spec.actions.high)
        self.register_buffer("center", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)
        self.exploration_noise = exploration_noise  # deterministic actors: Gaussian, in
                                                    # half-ranges (not saved: it is config)

    def q(self, critics, obs, action, params: dict | None = None):
        """Each critic's Q(obs, action), stacked: (critics, rows); on `params` (the critics'
        parameters by name, "0.0.weight" ...) instead of their own where given."""
        pair = torch.cat([obs, action], -1)
        if params is None:
            return torch.stack([c(pair).squeeze(-1) for c in critics])
        return torch.stack([
            torch.func.functional_call(c, {n[len(f"{i}."):]: p for n, p in params.items()
                                           if n.startswith(f"{i}.")}, (pair,)).squeeze(-1)
            for i, c in enumerate(critics)])

    def alpha(self, log_alpha: torch.Tensor | None = None) -> torch.Tensor:
        """The entropy weight (of `log_alpha` where given: the one being stepped)."""
        if self.entropy_bonus:
            return (self.log_alpha if log_alpha is None else log_alpha).exp()
        return torch.zeros((), device=self.center.device)

    def to_env(self, action):
        """[-1, 1] -> the env's Box."""
        return self.center + self.half_range * action

    def sample(self, obs, deterministic: bool = False, noise=None):
        """Acting (training.actors): (action in [-1, 1], None, the env's action); with
        exploration noise on a deterministic actor unless `deterministic`. `noise`: the
        standard normal draws of the Gaussian or of the exploration (default: torch's)."""
        action, _ = self.actor(obs, deterministic, noise)
        if not self.actor.stochastic and not deterministic and self.exploration_noise:
            noise = torch.randn_like(action) if noise is None else noise
            action = (action + noise * self.exploration_noise).clamp(-1, 1)
        return action, None, self.to_env(action)


class NetsOn:
    """A group's networks as a gradient step sees them, so the algorithms' hooks
    (`next_action`, `actor_loss`) take it in place of the group: the actor and critics on
    the step's parameters, the targets and alpha on the model's own, and the step's
    standard normal draws (`draws`, made before the step, taken in order). A population
    member's (offpolicy_members.MemberNets) runs the same on its own slices and draws."""

    def __init__(self, g, actor: dict, critics: dict, tau: float = 0.0, draws=()):
        self.model, self.spec = g.model, g.spec  # (no step count: a compiled step would
        # recompile for every value of it)
        self.actor_params, self.critic_params, self.tau = actor, critics, tau
        self.draws = iter(draws)  # shared with the copies `with_actor` makes

    def with_actor(self, params: dict) -> NetsOn:
        """The same networks, the actor on `params` (those its step differentiates)."""
        return NetsOn(self, params, self.critic_params, self.tau, self.draws)

    def actor(self, obs, deterministic: bool = False):
        noise = None if deterministic or not self.model.actor.stochastic else next(self.draws)
        return torch.func.functional_call(self.model.actor, self.actor_params,
                                          (obs, deterministic, noise))

    def target_actor(self, obs):
        return self.model.target_actor(obs)

    def q(self, critics, obs, action):
        online = critics is self.model.critics
        return self.model.q(critics, obs, action, self.critic_params if online else None)

    def randn_like(self, like):
        """Standard normal draws shaped as `like` (TD3's target smoothing)."""
        return next(self.draws)

    def alpha(self, log_alpha=None):
        return self.model.alpha(log_alpha)

    def soft_update(self):
        """Move the targets `tau` of the way towards the online networks."""
        with torch.no_grad():
            for online, target in ((self.critic_params, self.model.target_critics),
                                   (self.actor_params, self.model.target_actor)):
                named = dict(target.named_parameters())
                for name, value in online.items():
                    named[name].lerp_(value, self.tau)


class Optimizers:
    """A policy's Adams under one name, so checkpoints treat them as one."""

    def __init__(self, **optimizers):
        self.by_name = {k: v for k, v in optimizers.items() if v is not None}

    def __getitem__(self, name):
        return self.by_name[name]

    def state_dict(self) -> dict:
        return {name: adam.state_dict() for name, adam in self.by_name.items()}

    def load_state_dict(self, state: dict):
        for name, adam in self.by_name.items():
            adam.load_state_dict(state[name])


@dataclass
class OffPolicyGroup:
    """One policy: its space, agents, networks, Adams and replay shard, and how its steps
    run."""
    name: str
    spec: object
    agents: object
    model: OffPolicyModel
    optimizer: Optimizers
    replay: object           # its ReplayBuffer (a population's: offpolicy_members.MemberReplays)
    updates: int = 0         # gradient steps taken (TD3 delays its actor by this count)
    step: object = None      # one gradient step -> its statistics (chosen by `choose_speed`)
    store: object = None     # the replay's add (or, in a graphed rollout, its device-side write)
    graphs: dict = field(default_factory=dict)  # a graphed step's: actor due -> its StepGraph

    @functools.cached_property
    def optimized(self) -> dict:
        """Optimizer name -> (its parameters by name, its Adam)."""
        model, opts = self.model, self.optimizer.by_name
        params = {"actor": dict(model.actor.named_parameters()),
                  "critic": dict(model.critics.named_parameters()),
                  "alpha": {"log_alpha": model.log_alpha}}
        return {name: (params[name], opt) for name, opt in opts.items()}
