"""The config keys every MPE scenario has (mpe2's arguments of the same names)."""
from __future__ import annotations

from dataclasses import dataclass

from gpusim.config import EnvConfig, require


@dataclass(frozen=True)
class MpeConfig(EnvConfig):
    max_cycles: int = 25                # steps until the episode is truncated
    continuous_actions: bool = False    # Box(0, 1) actions instead of one Discrete

    def check(self):
        require(self.max_cycles >= 1, "max_cycles", "must be at least 1")


def require_count(config, key: str, least: int):
    require(getattr(config, key) >= least, key, f"must be at least {least}")


def require_neighbors(config, key: str):
    """mpe2's partial observability: None (observe all) or a positive count."""
    value = getattr(config, key)
    require(value is None or value >= 1, key, "must be a positive integer or null")
