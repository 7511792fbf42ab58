"""Per-episode measures of an env for evaluation: `StepSums`, the common case in one line.

An env names what `python -m gpusim.evaluate` reports beside the returns with
its `episode_measures()` hook: an object with `after_step(done)`, called after
every step, and `per_episode()` -> {name: [one value per finished episode]}
(`envs/tag_continuous/measures.py` is a full one). Most measures are a count or
sum over an episode's steps, which `StepSums` makes from one function per
measure:

    def episode_measures(self):
        return StepSums(self, captures=lambda env: env.arrays["caught"].sum(1))

Each function gets the env after a step and returns this step's amount per replica,
(num_envs,), or per agent, (num_envs, num_agents), summed over the agents. Read
what the step phases wrote and the reset phases leave alone (a scratch array,
the terminated flag): in a replica that just finished, the auto-reset has run by
the time the step returns.
"""
from __future__ import annotations

import torch

from gpusim.errors import GpusimError


class StepSums:
    """Per episode, the sum over its steps of each measure's per-step amount."""

    def __init__(self, env, **per_step):
        if not per_step:
            raise GpusimError(f"env {env.name}: StepSums needs at least one measure, as "
                              "name=function(env) -> (num_envs,) tensor")
        for name, fn in per_step.items():
            if not callable(fn):
                raise GpusimError(f"env {env.name}: measure {name!r} must be a function of "
                                  f"the env, got {type(fn).__name__}")
        self.env, self.per_step = env, per_step
        self.running = {name: torch.zeros(env.num_envs, dtype=torch.float64, device=env.device)
                        for name in per_step}
        self.values = {name: [] for name in per_step}

    def after_step(self, done: torch.Tensor):
        """Add this step's amounts; close the episodes that just ended."""
        for name, fn in self.per_step.items():
            amount = torch.as_tensor(fn(self.env), device=self.env.device)
            if amount.dim() == 2:
                amount = amount.sum(1)
            if tuple(amount.shape) != (self.env.num_envs,):
                raise GpusimError(f"env {self.env.name}: measure {name!r} gave shape "
                                  f"{tuple(amount.shape)}; it must give (num_envs,) or "
                                  "(num_envs, num_agents)")
            self.running[name] += amount.to(torch.float64)
        if bool(done.any()):
            for name, running in self.running.items():
                self.values[name] += running[done].tolist()
                running[done] = 0

    def per_episode(self) -> dict:
        return dict(self.values)
