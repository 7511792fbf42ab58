"""simple_tag: mpe2's simple_tag_v3, adversaries chase good agents among obstacles."""
from .config import SimpleTagConfig
from .env import SimpleTag

ENV = SimpleTag

__all__ = ["ENV", "SimpleTag", "SimpleTagConfig"]
