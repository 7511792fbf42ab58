"""mountain_car: gymnasium's MountainCar-v0, one agent per replica."""
from .config import MountainCarConfig
from .env import MountainCar

ENV = MountainCar

__all__ = ["ENV", "MountainCar", "MountainCarConfig"]
