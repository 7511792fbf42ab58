"""acrobot: gymnasium's Acrobot-v1, one agent per replica."""
from .config import AcrobotConfig
from .env import Acrobot

ENV = Acrobot

__all__ = ["ENV", "Acrobot", "AcrobotConfig"]
