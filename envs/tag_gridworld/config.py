"""Configuration of tag_gridworld (README.md in this directory gives each key's meaning)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from gpusim.config import EnvConfig, require

# Positions are int32 and normalised in float32: keep every coordinate exact.
MAX_GRID_SIZE = 1 << 16
# One replica is one GPU block, one thread per agent (taggers + the runner).
MAX_TAGGERS = 1023

REWARD_KEYS = ("wall_penalty", "tag_reward", "tag_penalty", "step_penalty_tagger",
               "step_reward_runner")
# Penalties are added to the reward as given, so they are written as values <= 0.
PENALTY_KEYS = ("wall_penalty", "tag_penalty", "step_penalty_tagger")


@dataclass(frozen=True)
class TagGridworldConfig(EnvConfig):
    num_taggers: int = 3                    # taggers (the runner is one more agent)
    grid_size: int = 11                     # cells per side
    episode_length: int = 100               # steps before truncation
    wall_penalty: float = -0.1              # reward for walking into a wall (<= 0)
    tag_reward: float = 10.0                # every tagger's reward when the runner is tagged
    tag_penalty: float = -5.0               # the runner's reward when tagged (<= 0)
    step_penalty_tagger: float = -0.01      # taggers' reward every untagged step (<= 0)
    step_reward_runner: float = 0.01        # the runner's reward every untagged step
    mask_walls: bool = False                # moves into a wall are masked out (an action
                                            # mask: a masked policy never pays wall_penalty)
    @property
    def num_agents(self) -> int:
        return self.num_taggers + 1

    @property
    def runner_id(self) -> int:
        return self.num_taggers

    def check(self):
        require(1 <= self.num_taggers <= MAX_TAGGERS, "num_taggers",
                f"must lie in 1..{MAX_TAGGERS}, got {self.num_taggers}")
        require(2 <= self.grid_size <= MAX_GRID_SIZE, "grid_size",
                f"must lie in 2..{MAX_GRID_SIZE}, got {self.grid_size}")
        require(self.episode_length >= 1, "episode_length",
                f"must be at least 1, got {self.episode_length}")
        for key in REWARD_KEYS:
            require(math.isfinite(getattr(self, key)), key, "must be a finite number")
        for key in PENALTY_KEYS:
            require(getattr(self, key) <= 0, key,
                    f"is added to the reward, so it must be <= 0, got {getattr(self, key)}")
