"""simple_adversary: mpe2's simple_adversary_v3, good agents hide the goal from an adversary."""
from .config import SimpleAdversaryConfig
from .env import SimpleAdversary

ENV = SimpleAdversary

__all__ = ["ENV", "SimpleAdversary", "SimpleAdversaryConfig"]
