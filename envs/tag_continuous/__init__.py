"""tag_continuous: the flagship multi-agent tag environment."""
from .config import TagContinuousConfig
from .env import TagContinuous

__all__ = ["TagContinuous", "TagContinuousConfig"]
