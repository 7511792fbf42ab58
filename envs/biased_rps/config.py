"""Configuration of biased_rps (README.md in this directory gives the rules)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from gpusim.config import EnvConfig, require

WIN_KEYS = ("rock_win", "paper_win", "scissors_win")


@dataclass(frozen=True)
class BiasedRPSConfig(EnvConfig):
    rock_win: float = 1.0       # what rock's player wins from scissors' (who loses as much)
    paper_win: float = 2.0      # paper over rock
    scissors_win: float = 3.0   # scissors over paper
    rounds: int = 1             # plays of the matrix per episode (the episode terminates
                                # after the last)

    def check(self):
        for key in WIN_KEYS:  # positive wins keep every action in the equilibrium
            value = getattr(self, key)
            require(math.isfinite(value) and value > 0, key,
                    f"must be a positive finite number, got {value}")
        require(self.rounds >= 1, "rounds", f"must be at least 1, got {self.rounds}")
