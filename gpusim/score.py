"""What an env names as its score: the one number a user watches rise while training.

A cooperative or single-agent env's score is its training return (the default: no
declaration). In a competitive env both sides learn at once and their returns cancel,
so the score is measured against fixed opponents on a few evaluation replicas beside
training: one side acts with its training network, every other policy uniformly at
random, and a per-episode value (tag_continuous: how long random runners survive the
trained taggers) is kept on the device. An env declares it as a class attribute:

    score = Score("runner_steps_survived", sides={"tagger": "lower", "runner": "higher"},
                  tracker=SurvivalScore)

`sides` maps each policy that may be the trained side to the direction its score
improves in: survival falls as taggers learn and rises as runners do. The first is
the default; `trainer.target_score` names the sides a run measures, each with its
target: `{tagger: 200, runner: 334}` stops a run once both hold.

`tracker(env)` builds an object whose `after_step(done)` returns, per replica, the value
of the episode that ended with this step (entries where `done` is False are ignored),
with no host read: training.score_monitor keeps the last episodes' values on the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gpusim.errors import GpusimError

DIRECTIONS = ("higher", "lower")


@dataclass(frozen=True)
class Score:
    name: str                 # what is measured, as metrics name it: score/<name>
    sides: dict               # policy -> higher | lower: a side that may act trained (the
                              # others act uniformly at random), and where its score improves
    tracker: Callable         # tracker(env) -> object with after_step(done) -> (num_envs,)

    def __post_init__(self):
        bad = {side: better for side, better in self.sides.items() if better not in DIRECTIONS}
        if not self.sides or bad:
            raise GpusimError(f"Score {self.name!r}: sides must map policies to one of "
                              f"{DIRECTIONS}, got {self.sides!r}")

    def side(self, env, policy: str | None) -> str:
        """A trained side: `policy` (a key of trainer.target_score), else the first
        declared; one the score or the env does not have is refused, naming what it has."""
        side = policy or next(iter(self.sides))
        if side not in self.sides or side not in env.policy_specs:
            raise GpusimError(f"config key 'trainer.target_score' must name sides of env "
                              f"{env.name}'s score {self.name!r} "
                              f"({', '.join(s for s in self.sides if s in env.policy_specs)}), "
                              f"got {side!r}")
        return side

    def reached(self, side: str, value: float, target: float) -> bool:
        return value >= target if self.sides[side] == "higher" else value <= target
