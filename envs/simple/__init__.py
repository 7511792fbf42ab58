"""simple: mpe2's simple_v3, one agent and one landmark."""
from .config import SimpleConfig
from .env import Simple

ENV = Simple

__all__ = ["ENV", "Simple", "SimpleConfig"]
