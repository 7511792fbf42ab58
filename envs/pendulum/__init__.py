"""pendulum: gymnasium's Pendulum-v1 (continuous torque), one agent per replica."""
from .config import PendulumConfig
from .env import Pendulum

ENV = Pendulum

__all__ = ["ENV", "Pendulum", "PendulumConfig"]
