"""One acting path, used by training rollouts, `evaluate` and `render`.

`Actors(env, policies).act(obs)` draws every agent's action for one env step
and writes it straight into the env's action arrays, so the caller steps
with `env.step()` (no actions argument: nothing is copied again). Discrete
actions come from one sampler launch for every discrete agent of every
policy, from the log-probabilities the policies wrote side by side;
continuous ones from each policy's own head. It returns, per policy, what a
learner stores (choice indices, or the head's own action variable) and the
log-probability of the draw.

A policy is an object with either
- `log_probs(obs, mask)` -> (..., sum of its choices) log-probabilities,
  side by side per component (discrete actions), or
- `sample(obs, deterministic)` -> (stored action, its log-prob or None, the
  env's action) (continuous actions);
or None: uniformly random actions (`UniformPolicy`).
Where the env declares an action mask (`env.action_mask()`), masked choices
get log-probability -inf, so the sampler never draws them.

A recurrent policy (`state_size` > 0) takes its state as a last argument and
returns the next one last; the actors keep one state per agent
(`memory[name]`) and restart it where an episode ended (`episode_ended`).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from gpusim.sampler import ActionSampler
from gpusim.spaces import agent_index


class Acted(NamedTuple):
    stored: dict     # policy name -> what its learner stores: (envs, agents, width)
    log_prob: dict   # policy name -> (envs, agents) log-probability of the draw (or None)


class UniformPolicy:
    """Uniformly random actions: every legal choice alike, or uniform within the Box (the
    stored action is its position in [-1, 1] per dimension, as the off-policy learners
    store actions)."""

    def __init__(self, spec, device):
        self.continuous = spec.continuous
        if spec.continuous:
            low = torch.tensor(spec.actions.low, dtype=torch.float32, device=device)
            high = torch.tensor(spec.actions.high, dtype=torch.float32, device=device)
            self.center, self.half_range = (high + low) / 2, (high - low) / 2
            self.width = spec.action_width
        else:
            self.width = sum(spec.actions)

    def log_probs(self, obs, mask=None):
        zeros = torch.zeros(obs.shape[:-1] + (self.width,), device=obs.device)
        return zeros if mask is None else zeros.masked_fill(~mask, float("-inf"))

    def sample(self, obs, deterministic: bool = False):
        unit = torch.rand(obs.shape[:-1] + (self.width,), device=obs.device) * 2 - 1
        return unit, None, self.center + self.half_range * unit


class Actors:
    """Every agent's action for one step, written into the env's action arrays.

    `policies`: policy name -> policy object, or None for uniformly random
    actions. `wrap(fn, what)` may wrap each policy's acting function (the
    learner's torch.compile). The caller runs `act` under its autocast as it
    needs; acting runs without autograd.
    """

    def __init__(self, env, policies: dict, wrap=None):
        self.env = env
        self.specs = env.policy_specs
        wrap = wrap or (lambda fn, what: fn)
        self.policies = {name: policies.get(name) or UniformPolicy(spec, env.device)
                         for name, spec in self.specs.items()}
        self.agents = {name: agent_index(spec.agent_ids, env.device)
                       for name, spec in self.specs.items()}
        self.acting = {name: wrap(policy.sample if spec.continuous else policy.log_probs,
                                  f"policy {name!r} (acting)")
                       for (name, spec), policy in zip(self.specs.items(),
                                                       self.policies.values())}
        self.memory = {name: torch.zeros((env.num_envs, spec.num_agents, policy.state_size),
                                         device=env.device)
                       for (name, spec), policy in zip(self.specs.items(),
                                                       self.policies.values())
                       if getattr(policy, "state_size", 0)}
        self.sampler = ActionSampler(env, into_env=True) if env.discrete_width else None
        if self.sampler is not None:
            self.weights = torch.zeros((env.num_envs, env.num_agents, self.sampler.width),
                                       device=env.device)
        # Views of fixed buffers, made once: at rollout sizes indexing costs as much as
        # the arithmetic. Per discrete policy: where its weights, draws and their
        # log-probabilities lie; per policy, its part of the last `obs` acted on.
        self.drawn = {name: (self.weights[:, agents, :sum(spec.actions)],
                             self.sampler.actions[:, agents, :spec.action_width],
                             self.sampler.log_prob[:, agents])
                      for (name, spec), agents in zip(self.specs.items(), self.agents.values())
                      if not spec.continuous}
        self._own = (None, {})  # (obs tensor, name -> its part of it)
        # policies whose agents are not side by side: their part is a gather, a copy
        self._spread = [name for name, agents in self.agents.items()
                        if not isinstance(agents, slice)]

    @torch.no_grad()  # acting never trains through the draw
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> Acted:
        """Actions for the observation `obs` (the env's (envs, agents, obs) array);
        deterministic: the most likely choice, the Gaussian's mean, no exploration noise."""
        stored, log_prob = {}, {}
        mask = self.env.action_mask()
        own_views = self._own_views(obs)
        for name, spec in self.specs.items():
            agents = self.agents[name]
            own = own_views[name]
            memory = self.memory.get(name)
            state = () if memory is None else (memory,)
            if spec.continuous:
                out = self.acting[name](own, deterministic, *state)
                stored[name], log_prob[name], env_action = out[:3]
                self.env.arrays["continuous_actions"][:, agents, :spec.action_width] = env_action
            else:
                width = sum(spec.actions)
                own_mask = None if mask is None else mask[:, agents, :width]
                out = self.acting[name](own, own_mask, *state)
                # The weights are exponentiated here, in one vectorised pass per policy,
                # rather than by the sampler's kernel, whose scalar exp runs twice per choice
                # (0.9 against 0.4 ms a step for tag_continuous's 1,760 agents x 42 choices
                # on one CPU core). The drawn log-probabilities agree with the policy's
                # within 1e-6 (tests/runtime/test_sampler.py).
                torch.exp(out[0] if state else out, out=self.drawn[name][0])
            if memory is not None:
                memory.copy_(out[-1])
        if self.sampler is not None:  # one launch: every discrete agent, into env.arrays
            self.sampler.sample(self.weights, argmax=deterministic)
            for name, (_, actions, drawn_log_prob) in self.drawn.items():
                stored[name], log_prob[name] = actions, drawn_log_prob
        return Acted(stored, log_prob)

    def _own_views(self, obs: torch.Tensor) -> dict:
        """Per policy, its agents' own entries of `obs`. Views (agents side by side) are
        made again only for another tensor: the rollouts act on the env's own obs buffer
        at every step. Agents spread out are gathered, a copy, at every call."""
        seen, parts = self._own
        if seen is not obs:
            parts = {name: obs[:, self.agents[name], :spec.obs_dim]
                     for name, spec in self.specs.items()}
            self._own = (obs, parts)
            return parts
        for name in self._spread:
            parts[name] = obs[:, self.agents[name], :self.specs[name].obs_dim]
        return parts

    def episode_ended(self, done: torch.Tensor, active: torch.Tensor | None = None):
        """Restart recurrent states: in replicas that finished (`done`), and of agents no
        longer in play (`active` False, with per-agent done)."""
        for name, memory in self.memory.items():
            keep = ~done[:, None]
            if active is not None:
                keep = keep & active[:, self.agents[name]]
            memory.mul_(keep[..., None].to(memory.dtype))
