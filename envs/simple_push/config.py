"""Configuration of simple_push (README.md in this folder gives the rules): mpe2's
arguments (mpe2 fixes the counts: one adversary, one good agent, two landmarks)."""
from __future__ import annotations

from dataclasses import dataclass

from .._mpe.config import MAX_CYCLES, MpeConfig


@dataclass(frozen=True)
class SimplePushConfig(MpeConfig):
    max_cycles: int = MAX_CYCLES            # steps until the episode is truncated
    continuous_actions: bool = False        # Box(0, 1) actions instead of one Discrete
