"""simple_world_comm: mpe2's simple_world_comm_v3, predators led by a speaking leader hunt
prey that forage and hide in forests."""
from .config import SimpleWorldCommConfig
from .env import SimpleWorldComm

ENV = SimpleWorldComm

__all__ = ["ENV", "SimpleWorldComm", "SimpleWorldCommConfig"]
