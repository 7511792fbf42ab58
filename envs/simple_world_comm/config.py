"""Configuration of simple_world_comm (README.md in this folder gives the rules): mpe2's
arguments."""
from __future__ import annotations

from dataclasses import dataclass

from .._mpe.config import MAX_CYCLES, MpeConfig, require_count


@dataclass(frozen=True)
class SimpleWorldCommConfig(MpeConfig):
    max_cycles: int = MAX_CYCLES            # steps until the episode is truncated
    continuous_actions: bool = False        # Box(0, 1) actions instead of one Discrete
    num_good: int = 2           # good agents (prey), after the adversaries
    num_adversaries: int = 4    # adversaries, the leader (agent 0) included
    num_obstacles: int = 1      # landmarks that block the way
    num_food: int = 2           # landmarks that reward good agents near them
    num_forests: int = 2        # landmarks that hide the agents inside them

    def check(self):
        super().check()
        require_count(self, "num_good", 1)
        require_count(self, "num_adversaries", 1)
        require_count(self, "num_obstacles", 0)
        require_count(self, "num_food", 1)
        require_count(self, "num_forests", 0)
