"""Configuration of tag_continuous (README.md in this folder gives every key its meaning)."""
from __future__ import annotations

from dataclasses import dataclass

from gpusim.config import EnvConfig, require


@dataclass(frozen=True)
class TagContinuousConfig(EnvConfig):
    num_taggers: int = 10                   # agents that chase
    num_runners: int = 100                  # agents that flee
    tagger_ids: tuple[int, ...] | None = None  # the taggers' agent ids (default: the first)
    grid_length: float = 20.0               # side of the square arena
    episode_length: int = 500               # steps before truncation
    max_acceleration: float = 0.1           # largest acceleration action
    min_acceleration: float = -0.1          # smallest acceleration action
    max_turn: float = 2.356                 # largest turn action (radians)
    min_turn: float = -2.356                # smallest turn action (radians)
    num_acceleration_levels: int = 20       # acceleration choices besides the no-op
    num_turn_levels: int = 20               # turn choices besides the no-op
    continuous_actions: bool = False        # act with floats (acceleration change, turn)
                                            # in [min, max] instead of the levels
    skill_level_tagger: float = 1.0         # taggers' top speed, times max_speed
    skill_level_runner: float = 1.0         # runners' top speed, times max_speed
    max_speed: float = 1.0                  # top speed
    num_other_agents_observed: int = 10     # neighbours in an observation (K)
    use_full_observation: bool = False      # observe every other agent instead of K
    observe_own_state: bool = False         # append own x/L, y/L, cos, sin of heading,
                                            # speed/max_speed before the timestep (+5 floats)
    observe_in_own_frame: bool = False      # neighbours' offsets as (forward, left) along
                                            # own heading instead of world (dx, dy)
    runner_exits_game_after_tagged: bool = True # a tagged runner leaves the game
    tag_reward_for_tagger: float = 10.0     # a tagger's reward per tag
    tag_penalty_for_runner: float = -10.0   # a runner's reward when tagged
    step_penalty_for_tagger: float = 0.0    # a tagger's reward every step
    step_reward_for_runner: float = 0.0     # a runner's reward every step
    edge_hit_penalty: float = 0.0           # reward for hitting the edge (<= 0)
    end_of_game_reward_for_runner: float = 1.0 # a runner's reward for lasting the episode
    tagging_distance: float = 0.02          # tag radius, as a fraction of grid_length
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
        if self.continuous_actions:  # the bounds of a Box: low < high
            require(self.min_acceleration < self.max_acceleration, "min_acceleration",
                    "must be below max_acceleration with continuous_actions")
            require(self.min_turn < self.max_turn, "min_turn",
                    "must be below max_turn with continuous_actions")
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
