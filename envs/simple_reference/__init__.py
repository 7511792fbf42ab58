"""simple_reference: mpe2's simple_reference_v3, two agents guide each other to goals."""
from .config import SimpleReferenceConfig
from .env import SimpleReference

ENV = SimpleReference

__all__ = ["ENV", "SimpleReference", "SimpleReferenceConfig"]
