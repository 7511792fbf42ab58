"""Configuration of simple_spread (README.md in this folder gives the rules): mpe2's
arguments."""
from __future__ import annotations

from dataclasses import dataclass

from gpusim.config import require

from .._mpe.config import MAX_CYCLES, MpeConfig, require_count, require_neighbors


@dataclass(frozen=True)
class SimpleSpreadConfig(MpeConfig):
    max_cycles: int = MAX_CYCLES            # steps until the episode is truncated
    continuous_actions: bool = False        # Box(0, 1) actions instead of one Discrete
    N: int = 3                              # agents, and as many landmarks
    local_ratio: float = 0.5                # weight of an agent's own collision reward;
                                            # the shared cover reward has 1 - local_ratio
    curriculum: bool = False                # mpe2's curriculum stage 0: no collision penalty
    terminate_on_success: bool = False      # end an episode once every landmark has an
                                            # agent within 0.1
    num_agent_neighbors: int | None = None  # observe only the n nearest other agents
    num_landmark_neighbors: int | None = None  # observe only the n nearest landmarks

    def check(self):
        super().check()
        require_count(self, "N", 1)
        require(0.0 <= self.local_ratio <= 1.0, "local_ratio", "must lie in [0, 1]")
        require_neighbors(self, "num_agent_neighbors")
        require_neighbors(self, "num_landmark_neighbors")
