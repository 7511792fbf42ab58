"""Who won a league game (training.league.self_play's win statistics, which PFSP and `lowest`
eviction read): the env's declared outcome (gpusim.outcome), else the learner's return.

Per frozen replica, the learner is the policy of that replica's matchup. The env's
outcome (tag_continuous: the runners' mean steps survived) is tracked on the device at
every step of the rollout; the learner wins an episode when the value is beyond the
outcome's threshold in the learner's direction (biased_rps: the row player's payoff
above 0 for the row, below for the column), or, where the outcome has no threshold,
beyond that learner's running mean of the value in its league games (tag_continuous:
runners win when they survive longer than the running mean of their league games,
taggers when the runners survive less than the mean of theirs). Without a declared
outcome the value is the learner's episode return and its direction "higher". At the
threshold an episode is half a win. No host read.
"""
from __future__ import annotations

import torch


class LeagueOutcome:
    """The per-episode value a league game is won by, and its wins (see the module)."""

    def __init__(self, env, names: list, rollout_len: int):
        self.declared = getattr(env, "outcome", None)
        self.tracker = None
        if self.declared is not None:
            self.tracker = self.declared.tracker(env)
            self.values = torch.zeros((rollout_len, env.num_envs), device=env.device)
            directions = [self.declared.direction(n, names) for n in names]
        else:
            directions = [1.0] * len(names)
        self.direction = torch.tensor(directions, device=env.device)

    @property
    def name(self) -> str:
        return "return" if self.declared is None else self.declared.name

    def after_step(self, t: int, done: torch.Tensor):
        """Step t: the value of the episodes that ended with it (a declared outcome's)."""
        if self.tracker is not None:
            self.values[t].copy_(self.tracker.after_step(done))

    def value(self, returns: torch.Tensor, frozen, learner: torch.Tensor) -> torch.Tensor:
        """(steps, replicas) the value of the frozen replicas' episodes: the declared
        outcome's, else the learner's return (`returns`: (steps, policies, envs))."""
        if self.tracker is not None:
            return self.values[:, frozen]
        own = returns[:, :, frozen]
        return own.gather(1, learner.expand(own.shape[0], 1, -1)).squeeze(1)

    def wins(self, value: torch.Tensor, learner: torch.Tensor,
             baseline: torch.Tensor) -> torch.Tensor:
        """1 where the learner won, 0.5 at the threshold (the declared one, else its
        running mean `baseline`), 0 where it lost."""
        fixed = None if self.declared is None else self.declared.threshold
        threshold = baseline[learner] if fixed is None else fixed
        margin = self.direction[learner] * (value - threshold)
        return (margin > 0).float() + 0.5 * (margin == 0).float()

    def state_dict(self) -> dict:
        saver = getattr(self.tracker, "state_dict", None)
        return saver() if saver is not None else {}

    def load_state_dict(self, state: dict):
        loader = getattr(self.tracker, "load_state_dict", None)
        if loader is not None and state:
            loader(state)
