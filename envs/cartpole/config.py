"""Configuration of cartpole (gymnasium CartPole-v1 constants; rules in README.md)."""
from __future__ import annotations

from dataclasses import dataclass

from gpusim.config import EnvConfig, require


@dataclass(frozen=True)
class CartPoleConfig(EnvConfig):
    gravity: float = 9.8
    cart_mass: float = 1.0
    pole_mass: float = 0.1
    pole_half_length: float = 0.5
    force_mag: float = 10.0
    tau: float = 0.02
    x_threshold: float = 2.4
    theta_threshold_degrees: float = 12.0
    max_episode_steps: int = 500
    init_range: float = 0.05

    def check(self):
        for key in ("gravity", "cart_mass", "pole_mass", "pole_half_length", "tau",
                    "x_threshold", "theta_threshold_degrees"):
            require(getattr(self, key) > 0, key, "must be positive")
        require(self.force_mag >= 0, "force_mag", "must be >= 0")
        require(self.max_episode_steps >= 1, "max_episode_steps", "must be at least 1")
        require(self.init_range >= 0, "init_range", "must be >= 0")
