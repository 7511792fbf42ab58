"""simple_spread: mpe2's simple_spread_v3, N agents cover N landmarks."""
from .config import SimpleSpreadConfig
from .env import SimpleSpread

ENV = SimpleSpread

__all__ = ["ENV", "SimpleSpread", "SimpleSpreadConfig"]
