"""Configuration of simple_adversary (README.md in this folder gives the rules): mpe2's
arguments."""
from __future__ import annotations

from dataclasses import dataclass

from .._mpe.config import MpeConfig, require_count, require_neighbors


@dataclass(frozen=True)
class SimpleAdversaryConfig(MpeConfig):
    N: int = 2                              # good agents, and as many landmarks
    num_agent_neighbors: int | None = None  # observe only the n nearest other agents
    num_landmark_neighbors: int | None = None  # observe only the n nearest landmarks

    def check(self):
        super().check()
        require_count(self, "N", 1)
        require_neighbors(self, "num_agent_neighbors")
        require_neighbors(self, "num_landmark_neighbors")
