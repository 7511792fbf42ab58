"""Configuration of simple_tag (README.md in this folder gives the rules): mpe2's
arguments."""
from __future__ import annotations

from dataclasses import dataclass

from .._mpe.config import MAX_CYCLES, MpeConfig, require_count, require_neighbors


@dataclass(frozen=True)
class SimpleTagConfig(MpeConfig):
    max_cycles: int = MAX_CYCLES            # steps until the episode is truncated
    continuous_actions: bool = False        # Box(0, 1) actions instead of one Discrete
    num_good: int = 1                       # good agents (prey), after the adversaries
    num_adversaries: int = 3                # adversaries (predators), the first agent ids
    num_obstacles: int = 2                  # landmarks that block the way
    curriculum: bool = False                # mpe2's curriculum stage 0: prey at half speed
    terminate_on_success: bool = False      # end an episode once every good agent is caught
    num_agent_neighbors: int | None = None  # observe only the n nearest other agents
    num_landmark_neighbors: int | None = None  # observe only the n nearest obstacles

    def check(self):
        super().check()
        require_count(self, "num_good", 1)
        require_count(self, "num_adversaries", 1)
        require_count(self, "num_obstacles", 0)
        require_neighbors(self, "num_agent_neighbors")
        require_neighbors(self, "num_landmark_neighbors")
