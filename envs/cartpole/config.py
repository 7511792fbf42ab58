"""Configuration of cartpole (gymnasium CartPole-v1 constants; rules in README.md)."""
from __future__ import annotations

from dataclasses import dataclass

from gpusim.config import EnvConfig, require


@dataclass(frozen=True)
class CartPoleConfig(EnvConfig):
    gravity: float = 9.8                    # m/s^2
    cart_mass: float = 1.0                  # kg
    pole_mass: float = 0.1                  # kg
    pole_half_length: float = 0.5           # m
    force_mag: float = 10.0                 # push of either action, N
    tau: float = 0.02                       # seconds per step
    x_threshold: float = 2.4                # cart position beyond which the episode terminates
    theta_threshold_degrees: float = 12.0   # pole angle beyond which the episode terminates
    max_episode_steps: int = 500            # steps before truncation
    init_range: float = 0.05                # initial state uniform in +-this
    def check(self):
        for key in ("gravity", "cart_mass", "pole_mass", "pole_half_length", "tau",
                    "x_threshold", "theta_threshold_degrees"):
            require(getattr(self, key) > 0, key, "must be positive")
        require(self.force_mag >= 0, "force_mag", "must be >= 0")
        require(self.max_episode_steps >= 1, "max_episode_steps", "must be at least 1")
        require(self.init_range >= 0, "init_range", "must be >= 0")
