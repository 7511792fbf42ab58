"""Configuration of tag_continuous (README.md in this folder gives every key its meaning)."""
from __future__ import annotations

from dataclasses import dataclass

from gpusim.config import EnvConfig, require


@dataclass(frozen=True)
class TagContinuousConfig(EnvConfig):
    num_taggers: int = 10
    num_runners: int = 100
    tagger_ids: tuple[int, ...] | None = None
    grid_length: float = 20.0
    episode_length: int = 500
    max_acceleration: float = 0.1
    min_acceleration: float = -0.1
    max_turn: float = 2.356
    min_turn: float = -2.356
    num_acceleration_levels: int = 20
    num_turn_levels: int = 20
    skill_level_tagger: float = 1.0
    skill_level_runner: float = 1.0
    max_speed: float = 1.0
    num_other_agents_observed: int = 10
    use_full_observation: bool = False
    runner_exits_game_after_tagged: bool = True
    tag_reward_for_tagger: float = 10.0
    tag_penalty_for_runner: float = -10.0
    step_penalty_for_tagger: float = 0.0
    step_reward_for_runner: float = 0.0
    edge_hit_penalty: float = 0.0
    end_of_game_reward_for_runner: float = 1.0
    tagging_distance: float = 0.02

    @property
    def num_agents(self) -> int:
        return self.num_taggers + self.num_runners

    @property
    def tagger_id_list(self) -> tuple[int, ...]:
        if self.tagger_ids is None:
            return tuple(range(self.num_taggers))
        return tuple(sorted(self.tagger_ids))

    def check(self):
        require(self.num_taggers >= 1, "num_taggers", "must be at least 1")
        require(self.num_runners >= 1, "num_runners", "must be at least 1")
        require(self.grid_length > 0, "grid_length", "must be positive")
        require(self.episode_length >= 1, "episode_length", "must be at least 1")
        require(self.min_acceleration <= self.max_acceleration, "min_acceleration",
                "must not exceed max_acceleration")
        require(self.min_turn <= self.max_turn, "min_turn", "must not exceed max_turn")
        require(self.num_acceleration_levels >= 1, "num_acceleration_levels",
                "must be at least 1")
        require(self.num_turn_levels >= 1, "num_turn_levels", "must be at least 1")
        require(self.skill_level_tagger >= 0, "skill_level_tagger", "must be >= 0")
        require(self.skill_level_runner >= 0, "skill_level_runner", "must be >= 0")
        require(self.max_speed > 0, "max_speed", "must be positive")
        require(self.num_other_agents_observed >= 1, "num_other_agents_observed",
                "must be at least 1")
        require(self.edge_hit_penalty <= 0, "edge_hit_penalty", "must be <= 0")
        require(self.tagging_distance >= 0, "tagging_distance", "must be >= 0")
        if self.tagger_ids is not None:
            ids = self.tagger_ids
            require(len(ids) == self.num_taggers, "tagger_ids",
                    f"must list exactly num_taggers={self.num_taggers} ids")
            require(len(set(ids)) == len(ids), "tagger_ids", "must not repeat an id")
            require(all(0 <= i < self.num_agents for i in ids), "tagger_ids",
                    f"ids must lie in 0..{self.num_agents - 1}")
