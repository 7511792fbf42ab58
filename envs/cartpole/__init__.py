"""cartpole: gymnasium's CartPole-v1, one agent per replica."""
from .config import CartPoleConfig
from .env import CartPole

__all__ = ["CartPole", "CartPoleConfig"]
