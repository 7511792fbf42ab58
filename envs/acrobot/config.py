"""Configuration of acrobot (gymnasium Acrobot-v1 constants; rules in README.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from gpusim.config import EnvConfig, require


@dataclass(frozen=True)
class AcrobotConfig(EnvConfig):
    link_length_1: float = 1.0              # length of link 1 (shoulder to elbow), m
    link_length_2: float = 1.0              # length of link 2 (drawn only: not in the dynamics), m
    link_mass_1: float = 1.0                # mass of link 1, kg
    link_mass_2: float = 1.0                # mass of link 2, kg
    link_com_pos_1: float = 0.5             # centre of mass of link 1, m from its joint
    link_com_pos_2: float = 0.5             # centre of mass of link 2, m from its joint
    link_moi: float = 1.0                   # moment of inertia of either link, kg m^2
    max_vel_1: float = 4 * math.pi          # |dtheta1| is clipped to this, rad/s
    max_vel_2: float = 9 * math.pi          # |dtheta2| is clipped to this, rad/s
    avail_torque: tuple[float, ...] = (-1.0, 0.0, 1.0)  # torque of actions 0, 1, 2, N m
    dt: float = 0.2                         # seconds per step (one RK4 step)
    book_or_nips: str = "book"              # book (Sutton & Barto's equations) | nips (the
                                            # 1995 paper's, without the dtheta1^2 term)
    max_episode_steps: int = 500            # steps before truncation
    init_range: float = 0.1                 # initial state uniform in +-this

    def check(self):
        for key in ("link_length_1", "link_length_2", "link_mass_1", "link_mass_2",
                    "link_com_pos_1", "link_com_pos_2", "link_moi", "max_vel_1", "max_vel_2",
                    "dt"):
            require(getattr(self, key) > 0, key, "must be positive")
        require(len(self.avail_torque) == 3, "avail_torque",
                "must list exactly 3 torques (actions 0, 1, 2)")
        require(self.book_or_nips in ("book", "nips"), "book_or_nips", "must be book or nips")
        require(self.max_episode_steps >= 1, "max_episode_steps", "must be at least 1")
        require(self.init_range >= 0, "init_range", "must be >= 0")
