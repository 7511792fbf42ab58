"""Configuration of simple_reference (README.md in this folder gives the rules): mpe2's
arguments (mpe2 fixes the counts: two agents, three landmarks)."""
from __future__ import annotations

from dataclasses import dataclass

from gpusim.config import require

from .._mpe.config import MAX_CYCLES, MpeConfig


@dataclass(frozen=True)
class SimpleReferenceConfig(MpeConfig):
    max_cycles: int = MAX_CYCLES            # steps until the episode is truncated
    continuous_actions: bool = False        # Box(0, 1) actions instead of one Discrete
    local_ratio: float = 0.5        # weight of an agent's own reward; the mean of both
                                    # agents' rewards has 1 - local_ratio

    def check(self):
        super().check()
        require(0.0 <= self.local_ratio <= 1.0, "local_ratio", "must lie in [0, 1]")
