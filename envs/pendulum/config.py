"""Configuration of pendulum (gymnasium Pendulum-v1 constants; rules in README.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from gpusim.config import EnvConfig, require


@dataclass(frozen=True)
class PendulumConfig(EnvConfig):
    max_speed: float = 8.0          # |theta_dot| is clipped to this, rad/s
    max_torque: float = 2.0         # the action (torque, N m) is clipped to +-this
    dt: float = 0.05                # seconds per step (one semi-implicit Euler step)
    g: float = 10.0                 # gravity, m/s^2 (gymnasium's `g` argument)
    m: float = 1.0                  # mass at the tip, kg
    l: float = 1.0                  # length of the rod, m
    max_episode_steps: int = 200    # steps before truncation (it never terminates)
    init_theta: float = math.pi     # initial theta uniform in +-this (gymnasium's x_init)
    init_theta_dot: float = 1.0     # initial theta_dot uniform in +-this (gymnasium's y_init)

    def check(self):
        for key in ("max_speed", "max_torque", "dt", "m", "l"):
            require(getattr(self, key) > 0, key, "must be positive")
        require(self.g >= 0, "g", "must be >= 0")
        require(1 <= self.max_episode_steps < 2**31, "max_episode_steps",
                "must be at least 1 (and below 2**31)")
        require(self.init_theta >= 0, "init_theta", "must be >= 0")
        require(self.init_theta_dot >= 0, "init_theta_dot", "must be >= 0")
