"""Configuration of simple (README.md in this folder gives the rules): mpe2's arguments."""
from __future__ import annotations

from dataclasses import dataclass

from .._mpe.config import MAX_CYCLES, MpeConfig


@dataclass(frozen=True)
class SimpleConfig(MpeConfig):
    max_cycles: int = MAX_CYCLES            # steps until the episode is truncated
    continuous_actions: bool = False        # Box(0, 1) actions instead of one Discrete
