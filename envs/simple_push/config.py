"""Configuration of simple_push (README.md in this folder gives the rules): mpe2's
arguments (mpe2 fixes the counts: one adversary, one good agent, two landmarks)."""
from __future__ import annotations

from dataclasses import dataclass

from .._mpe.config import MpeConfig


@dataclass(frozen=True)
class SimplePushConfig(MpeConfig):
    pass
