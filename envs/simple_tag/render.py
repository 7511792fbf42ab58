"""A frame of simple_tag: agents and landmarks in mpe2's colours."""
from .._mpe.render import draw

__all__ = ["draw"]
