"""How long runners survive: the measure that shows whether runners learned to flee.

Random taggers tag almost every runner within an episode of the default
config, so tags per episode barely move; survival does. Per finished
episode: the mean number of steps a runner stayed free (a runner never
tagged counts the whole episode) and the fraction of runners still free at
the end. Read once per step from the env's `tagged_by` scratch array (who
tagged each runner in this step; the auto-reset leaves it alone).
"""
from __future__ import annotations

import torch


class RunnerSurvival:
    def __init__(self, env):
        runners = env.policies["runner"]
        self.env = env
        self.runners = torch.tensor(runners, device=env.device)
        self.steps = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)
        self.tagged_at = torch.full((env.num_envs, len(runners)), -1, dtype=torch.long,
                                    device=env.device)
        self.survived, self.free = [], []

    def after_step(self, done: torch.Tensor):
        """Record this step's tags; summarise the episodes that just ended."""
        self.steps += 1
        tagged = self.env.arrays["tagged_by"][:, self.runners] >= 0
        first = tagged & (self.tagged_at < 0)
        self.tagged_at[first] = self.steps[:, None].expand_as(first)[first]
        if bool(done.any()):
            ended = done.nonzero().flatten()
            at = self.tagged_at[ended]
            free = at < 0
            steps = torch.where(free, self.steps[ended, None], at).float()
            self.survived += steps.mean(1).tolist()
            self.free += free.float().mean(1).tolist()
            self.tagged_at[ended] = -1
            self.steps[ended] = 0

    def per_episode(self) -> dict:
        return {"runner_steps_survived": self.survived, "runners_free_at_end": self.free}
