"""biased_rps: rock-paper-scissors with unequal wins, a cyclic zero-sum matrix game."""
from .config import BiasedRPSConfig
from .env import BiasedRPS

ENV = BiasedRPS

__all__ = ["ENV", "BiasedRPS", "BiasedRPSConfig"]
