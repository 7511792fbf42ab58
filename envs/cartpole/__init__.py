"""cartpole: gymnasium's CartPole-v1, one agent per replica."""
from .config import CartPoleConfig
from .env import CartPole

ENV = CartPole

__all__ = ["ENV", "CartPole", "CartPoleConfig"]
