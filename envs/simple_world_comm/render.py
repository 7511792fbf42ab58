"""A frame of simple_world_comm: agents and landmarks in mpe2's colours (forests green, food blue), and what the leader says."""
from .._mpe.render import draw

__all__ = ["draw"]
