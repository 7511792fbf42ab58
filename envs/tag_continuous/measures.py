"""How long runners survive: the measure that shows whether taggers and runners learned.

Random taggers tag almost every runner within an episode of the default
config, so tags per episode barely move; survival does. Per finished
episode: the mean number of steps a runner stayed free (a runner tagged at
step k counts k; one never tagged counts the whole episode) and the fraction
of runners still free at the end. Read from the env's `tagged_by` scratch
array (who tagged each runner in this step; the auto-reset leaves it alone).

`SurvivalOnDevice` keeps it on the device with no host read, for the score
measured beside training (gpusim.score) and the outcome a league's games are won by
(gpusim.outcome); `RunnerSurvival` lists it per episode
for `python -m gpusim.evaluate`.
"""
from __future__ import annotations

import torch


class SurvivalOnDevice:
    """Per replica, the running mean steps survived by its runners in this episode."""

    def __init__(self, env):
        self.env = env
        self.runners = torch.tensor(env.policies["runner"], device=env.device)
        self.free = torch.ones((env.num_envs, len(self.runners)), dtype=torch.bool,
                               device=env.device)
        self.survived = torch.zeros(env.num_envs, device=env.device)

    def after_step(self, done: torch.Tensor) -> torch.Tensor:
        """Count this step for the runners free before it; per replica, the mean steps its
        runners survived (the value of the episodes that ended with this step, where
        `done`), and the share of them free at the end."""
        self.survived += self.free.float().mean(1)
        self.free &= self.env.arrays["tagged_by"][:, self.runners] < 0
        ended = self.survived.clone()
        free_at_end = self.free.float().mean(1)
        self.survived.masked_fill_(done, 0.0)
        self.free |= done[:, None]
        return ended, free_at_end

    def state_dict(self) -> dict:  # (a league's outcome resumes its episodes exactly)
        return {"free": self.free.clone(), "survived": self.survived.clone()}

    def load_state_dict(self, state: dict):
        self.free.copy_(state["free"])
        self.survived.copy_(state["survived"])


class RunnerSurvival:
    """The survival of every finished episode, listed on the host (evaluation only)."""

    def __init__(self, env):
        self.on_device = SurvivalOnDevice(env)
        self.survived, self.free = [], []

    def after_step(self, done: torch.Tensor):
        survived, free = self.on_device.after_step(done)
        if bool(done.any()):
            self.survived += survived[done].tolist()
            self.free += free[done].tolist()

    def per_episode(self) -> dict:
        return {"runner_steps_survived": self.survived, "runners_free_at_end": self.free}


class SurvivalScore:
    """The score's tracker: the episodes' survival alone."""

    def __init__(self, env):
        self.on_device = SurvivalOnDevice(env)

    def after_step(self, done: torch.Tensor) -> torch.Tensor:
        return self.on_device.after_step(done)[0]

    def state_dict(self) -> dict:
        return self.on_device.state_dict()

    def load_state_dict(self, state: dict):
        self.on_device.load_state_dict(state)
