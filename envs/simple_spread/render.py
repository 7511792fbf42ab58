"""A frame of simple_spread: agents and landmarks in mpe2's colours."""
from .._mpe.render import draw

__all__ = ["draw"]
