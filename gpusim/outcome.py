"""What an env names as an episode's outcome: who won it, in the game's own terms.

A league draws its opponents by how often its learners beat each snapshot (PFSP), and
`python -m gpusim.league` rates players by the episodes they win. Without a declaration
a win is relative to the returns (above the learner's running mean return in training,
above the median return over the cross-play matrix in judging). An env whose game says
who won declares it as a class attribute, as it declares its score (gpusim.score):

    outcome = Outcome("runner_steps_survived", sides={"tagger": "lower", "runner": "higher"},
                      tracker=SurvivalScore)

`tracker(env)` builds an object whose `after_step(done)` returns, per replica, the value
of the episode that ended with this step (entries where `done` is False are ignored), on
the device with no host read: the same trackers a score uses. A tracker that carries
state across steps may give `state_dict()` and `load_state_dict(state)`: a resumed
league then continues its episodes' values exactly.

`sides` maps each policy to the direction its wins lie in. `threshold`: the value an
episode is won beyond; a value exactly at it is half a win to each side. None (the
default): relative, as the returns' rule, but on this value (training: the learner's
running mean of it in its league games; judging: the median over the matrix).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gpusim.errors import GpusimError

DIRECTIONS = ("higher", "lower")


@dataclass(frozen=True)
class Outcome:
    name: str                        # what is measured: league.json names it
    sides: dict                      # policy -> higher | lower: where its wins lie
    tracker: Callable                # tracker(env) -> object with after_step(done) -> (num_envs,)
    threshold: float | None = None   # won beyond it (ties half); None: relative (see the module)

    def __post_init__(self):
        bad = {side: way for side, way in self.sides.items() if way not in DIRECTIONS}
        if not self.sides or bad:
            raise GpusimError(f"Outcome {self.name!r}: sides must map policies to one of "
                              f"{DIRECTIONS}, got {self.sides!r}")

    def direction(self, side: str, policies) -> float:
        """+1 where `side` wins above the threshold, -1 below; a side not named takes the
        opposite of the one that is (a game of two); anything else is refused."""
        if side in self.sides:
            return 1.0 if self.sides[side] == "higher" else -1.0
        others = [p for p in policies if p != side]
        if len(others) == 1 and others[0] in self.sides:
            return -self.direction(others[0], policies)
        raise GpusimError(f"the outcome {self.name!r} names no direction for policy "
                          f"{side!r} (its sides: {', '.join(self.sides)})")


def win(value: float, threshold: float, direction: float) -> float:
    """1 won, 0.5 at the threshold, 0 lost: a side winning in `direction` (+1: above)."""
    margin = direction * (value - threshold)
    return 1.0 if margin > 0 else 0.5 if margin == 0 else 0.0
