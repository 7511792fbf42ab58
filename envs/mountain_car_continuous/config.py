"""Configuration of mountain_car_continuous (gymnasium MountainCarContinuous-v0 constants;
rules in README.md)."""
from __future__ import annotations

from dataclasses import dataclass

from gpusim.config import EnvConfig, require


@dataclass(frozen=True)
class MountainCarContinuousConfig(EnvConfig):
    min_position: float = -1.2      # left wall: position is clipped here (velocity zeroed)
    max_position: float = 0.6       # right end: position is clipped here
    max_speed: float = 0.07         # velocity is clipped to +-this
    goal_position: float = 0.45     # terminated once position >= this ...
    goal_velocity: float = 0.0      # ... and velocity >= this
    power: float = 0.0015           # velocity change of a full push (action +-1)
    max_episode_steps: int = 999    # steps before truncation
    reset_low: float = -0.6         # initial position uniform in [reset_low, reset_high]
    reset_high: float = -0.4        # (initial velocity 0)

    def check(self):
        require(self.min_position < self.max_position, "min_position",
                "must be below max_position")
        require(self.max_speed > 0, "max_speed", "must be positive")
        require(self.power >= 0, "power", "must be >= 0")
        require(1 <= self.max_episode_steps < 2**31, "max_episode_steps",
                "must be at least 1 (and below 2**31)")
        require(self.reset_low <= self.reset_high, "reset_low", "must not exceed reset_high")
        require(self.min_position <= self.reset_low and self.reset_high <= self.max_position,
                "reset_low", "the reset range must lie in [min_position, max_position]")
