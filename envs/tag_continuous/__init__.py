"""tag_continuous: the flagship multi-agent tag environment."""
from .config import TagContinuousConfig
from .env import TagContinuous

ENV = TagContinuous

__all__ = ["ENV", "TagContinuous", "TagContinuousConfig"]
