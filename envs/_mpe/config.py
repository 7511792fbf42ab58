"""What every MPE config shares: mpe2's defaults and checks of its arguments.

Each scenario's config dataclass declares `max_cycles` and `continuous_actions`
itself, from the defaults here, so that its --help lists them with their
descriptions (read from the class's own source).
"""
from __future__ import annotations

from gpusim.config import EnvConfig, require

MAX_CYCLES = 25  # mpe2's default episode length


class MpeConfig(EnvConfig):
    def check(self):
        require(self.max_cycles >= 1, "max_cycles", "must be at least 1")


def require_count(config, key: str, least: int):
    require(getattr(config, key) >= least, key, f"must be at least {least}")


def require_neighbors(config, key: str):
    """mpe2's partial observability: None (observe all) or a positive count."""
    value = getattr(config, key)
    require(value is None or value >= 1, key, "must be a positive integer or null")
