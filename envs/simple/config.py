"""Configuration of simple (README.md in this folder gives the rules): mpe2's arguments."""
from __future__ import annotations

from dataclasses import dataclass

from .._mpe.config import MpeConfig


@dataclass(frozen=True)
class SimpleConfig(MpeConfig):
    pass
