"""mountain_car_continuous: gymnasium's MountainCarContinuous-v0, one agent per replica."""
from .config import MountainCarContinuousConfig
from .env import MountainCarContinuous

ENV = MountainCarContinuous

__all__ = ["ENV", "MountainCarContinuous", "MountainCarContinuousConfig"]
