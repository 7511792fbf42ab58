"""`ScaleConfig`: the `scale` section of a run's config (multi-process runs, `--auto_scale`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpusim.config import require
from gpusim.errors import ConfigError, GpusimError
from gpusim.sizes import parse_size

OBJECTIVES = ("auto", "throughput", "memory", "time_to_score")
ONE_WEEK_S = 7 * 24 * 3600  # longest wait accepted: longer ones overflow datetime.timedelta


@dataclass(frozen=True)
class ScaleConfig:
    """Multi-process runs and `--auto_scale` (gpusim.scale.size_search, the generic
    searches, and gpusim.training.autoscale.auto_scale, their training trials)."""
    objective: str = "auto"          # time_to_score: the least predicted time to the
                                     # recipe's score; throughput: the fastest training;
                                     # memory: the largest num_envs, then rollout_len, that
                                     # fit; auto: time_to_score on the CPU, throughput on a
                                     # GPU (where time_to_score is not yet measured)
    noise_scale: float | None = None  # time_to_score: the recipe's gradient noise scale, env
                                      # steps per gradient step, as measured over a run
                                      # (trainer.noise_scale_every; None: measured in a trial
                                      # at initialisation, where it is smaller)
    slack: float = 0.1               # time_to_score: sizes predicted within this share of
                                     # the quickest count as tied; the one nearest the
                                     # config's is picked
    saturation: float = 0.05         # throughput: stop growing num_envs (or minibatch rows)
                                     # once a step gains less than this per doubling
    growth: int = 4                  # throughput: each step of the num_envs search multiplies
                                     # it by this, from the config's; then the last bracket
                                     # is refined at its geometric midpoint
    memory_budget: str | None = None  # per process, e.g. "2GiB" (default: free GPU memory,
                                      # or cpu_memory_fraction of free RAM)
    cpu_memory_fraction: float = 0.5  # default CPU budget: this share of free RAM
    headroom: float = 0.1            # share of the budget no trial may use
    max_num_envs: int = 65536        # the largest num_envs a search tries
    max_rollout_len: int = 1024      # the largest rollout_len a search tries
    min_rollout_len: int = 8         # the replica rule's floor (training.replicas): more
                                     # replicas shorten the rollout to hold the recipe's batch
                                     # down to this (GAE needs a horizon), then add minibatches;
                                     # memory: halve num_envs until a rollout this long fits
    trial_seconds: float = 1.0       # throughput: each trial trains this long, timed, after
                                     # its warm-up (at least one iteration)
    env_share: float = 0.25          # memory: the share the replica search may fill; the
                                     # rest is left for the training batch
    env_trial_steps: int = 5         # memory: steps after reset in a replica-count trial
    time_limit_s: float = 45.0       # whole search: no new trial starts after this
    timeout_s: float = 600.0         # how long ranks wait for each other (compiles, rendezvous)
    collective_timeout_s: float = 300.0  # how long a collective (all-reduce, DDP) waits for
                                         # every rank; a rank that never arrives ends the run
    ADVANCED: ClassVar[tuple] = (  # the search's own constants, apart in --help and the docs
        "saturation", "growth", "cpu_memory_fraction", "headroom", "env_share",
        "env_trial_steps", "slack")

    def check(self):
        require(self.objective in OBJECTIVES, "scale.objective", f"must be one of {OBJECTIVES}")
        if self.memory_budget is not None:
            try:
                parse_size(self.memory_budget)
            except GpusimError as exc:
                raise ConfigError(f"config key 'scale.memory_budget': {exc}") from None
        require(0 < self.saturation < 1, "scale.saturation", "must lie in (0, 1)")
        require(0 <= self.slack < 1, "scale.slack", "must lie in [0, 1)")
        require(self.noise_scale is None or self.noise_scale > 0, "scale.noise_scale",
                "must be positive (or null: measured in a trial)")
        require(0 < self.cpu_memory_fraction <= 1, "scale.cpu_memory_fraction",
                "must lie in (0, 1]")
        require(0 <= self.headroom < 1, "scale.headroom", "must lie in [0, 1)")
        require(0 < self.env_share <= 1, "scale.env_share", "must lie in (0, 1]")
        for key in ("max_num_envs", "max_rollout_len", "min_rollout_len", "env_trial_steps"):
            require(getattr(self, key) >= 1, f"scale.{key}", "must be at least 1")
        require(self.growth >= 2, "scale.growth", "must be at least 2")
        require(self.trial_seconds > 0, "scale.trial_seconds", "must be positive")
        require(self.min_rollout_len <= self.max_rollout_len, "scale.min_rollout_len",
                "must not exceed scale.max_rollout_len")
        for key in ("time_limit_s", "timeout_s", "collective_timeout_s"):
            require(getattr(self, key) > 0, f"scale.{key}", "must be positive")
            require(getattr(self, key) <= ONE_WEEK_S, f"scale.{key}",
                    f"must be at most {ONE_WEEK_S} s (one week)")
