"""tag_gridworld: taggers chase one runner on an integer grid."""
from .config import TagGridworldConfig
from .env import TagGridworld

ENV = TagGridworld

__all__ = ["ENV", "TagGridworld", "TagGridworldConfig"]
