"""Configuration of mountain_car (gymnasium MountainCar-v0 constants; rules in README.md)."""
from __future__ import annotations

from dataclasses import dataclass

from gpusim.config import EnvConfig, require


@dataclass(frozen=True)
class MountainCarConfig(EnvConfig):
    min_position: float = -1.2      # left wall: position is clipped here (velocity zeroed)
    max_position: float = 0.6       # right end: position is clipped here
    max_speed: float = 0.07         # velocity is clipped to +-this
    goal_position: float = 0.5      # terminated once position >= this ...
    goal_velocity: float = 0.0      # ... and velocity >= this
    force: float = 0.001            # velocity change of a push (actions 0 and 2)
    gravity: float = 0.0025         # velocity change of the slope: -gravity * cos(3 * position)
    max_episode_steps: int = 200    # steps before truncation
    reset_low: float = -0.6         # initial position uniform in [reset_low, reset_high]
    reset_high: float = -0.4        # (initial velocity 0)

    def check(self):
        require(self.min_position < self.max_position, "min_position",
                "must be below max_position")
        require(self.max_speed > 0, "max_speed", "must be positive")
        require(self.force >= 0, "force", "must be >= 0")
        require(self.gravity >= 0, "gravity", "must be >= 0")
        require(self.max_episode_steps >= 1, "max_episode_steps", "must be at least 1")
        require(self.reset_low <= self.reset_high, "reset_low", "must not exceed reset_high")
        require(self.min_position <= self.reset_low and self.reset_high <= self.max_position,
                "reset_low", "the reset range must lie in [min_position, max_position]")
