"""simple_push: mpe2's simple_push_v3, an adversary pushes a good agent off its goal."""
from .config import SimplePushConfig
from .env import SimplePush

ENV = SimplePush

__all__ = ["ENV", "SimplePush", "SimplePushConfig"]
