"""Configuration of simple_adversary (README.md in this folder gives the rules): mpe2's
arguments."""
from __future__ import annotations

from dataclasses import dataclass

from .._mpe.config import MAX_CYCLES, MpeConfig, require_count, require_neighbors


@dataclass(frozen=True)
class SimpleAdversaryConfig(MpeConfig):
    max_cycles: int = MAX_CYCLES            # steps until the episode is truncated
    continuous_actions: bool = False        # Box(0, 1) actions instead of one Discrete
    N: int = 2                              # good agents, and as many landmarks
    num_agent_neighbors: int | None = None  # observe only the n nearest other agents
    num_landmark_neighbors: int | None = None  # observe only the n nearest landmarks

    def check(self):
        super().check()
        require_count(self, "N", 1)
        require_neighbors(self, "num_agent_neighbors")
        require_neighbors(self, "num_landmark_neighbors")
