"""Auto-scale trials: a short training run of one size, timed after its warm-up."""
from __future__ import annotations

import math
import time
from dataclasses import replace

from gpusim.backends import kernels_built

from ..loop import Trainer

MAX_WARM_UP_ITERATIONS = 3


def compiles_so_far() -> int:
    """Kernels built in this process: a trial of a new size that adds to it compiled
    something the first trial did not (trials run uncompiled: torch.compile makes none)."""
    return kernels_built()


def training_trial(resize, env_class, context, seconds: float, episode_steps: int | None = None):
    """Body of a throughput trial: train for `seconds` the config `resize(value)` gives,
    uncompiled (every trial reuses what the first one built).

    `episode_steps`: time every size over the same steps of its episodes, the first
    `episode_steps` of each replica's, from a reset, as many times as `seconds` allows
    (the fastest counts: another process only ever slows a trial down). An iteration's
    cost changes within an episode (tag_continuous 10+100: 2.6x from its first 32 steps
    to its 256th, as runners leave play), and the replica rule shortens the rollout as
    replicas grow: timed over equal iterations instead, 64 replicas covered steps 8-40
    of their episodes and the recipe's 16 steps 32-160, and 64 looked 14% slower."""
    def body(value: int) -> dict:
        config = resize(value)  # (no score replicas: the trial times training alone)
        config = replace(config, trainer=replace(config.trainer, compile="off", score_envs=0,
                                                 target_score=None))
        before = compiles_so_far()
        trainer = Trainer(config, env_class, context.alone())
        if episode_steps is None:
            measured = measure_training(trainer, seconds=seconds)
        else:
            measured = measure_episode_start(trainer, episode_steps, seconds)
        return dict(measured, compiles=compiles_so_far() - before)
    return body


def warm_up(trainer: Trainer) -> None:
    """Iterate until the algorithm is past its warm-up (one iteration at least): it
    compiles, captures graphs, grows the allocator's pools."""
    done = 0
    while done == 0 or (trainer.algorithm.warming_up() and done < MAX_WARM_UP_ITERATIONS):
        trainer.iterate(trainer.config.trainer.lr)
        done += 1
    trainer.env.backend.synchronize()


def measure_training(trainer: Trainer, seconds: float) -> dict:
    """Steady env-steps/s after the warm-up, over at least `seconds` (one iteration at
    least), and the time split."""
    lr = trainer.config.trainer.lr
    warm_up(trainer)
    trainer.timer.reset()
    start = time.perf_counter()
    done = 0
    while done < 1 or time.perf_counter() - start < seconds:
        trainer.iterate(lr)  # its statistics are read on the host: each iteration syncs
        done += 1
    trainer.env.backend.synchronize()
    elapsed = time.perf_counter() - start
    shares = {k: round(v / elapsed, 3) for k, v in trainer.timer.totals().items()}
    steps = done * trainer.config.trainer.steps_per_iteration
    return {"env_steps_per_s": round(steps / elapsed, 1), "iterations": done,
            "time_share": shares}


def measure_episode_start(trainer: Trainer, episode_steps: int, seconds: float) -> dict:
    """Env-steps/s over the first `episode_steps` steps of every replica's episode after a
    reset, the fastest of as many such windows as `seconds` holds (one at least)."""
    t, lr = trainer.config.trainer, trainer.config.trainer.lr
    iterations = math.ceil(episode_steps / t.rollout_len)
    warm_up(trainer)
    best, windows, start = math.inf, 0, time.perf_counter()
    while windows < 1 or time.perf_counter() - start < seconds:
        trainer.env.reset()  # (in place: the policies read the fresh observations)
        trainer.env.backend.synchronize()
        began = time.perf_counter()
        for _ in range(iterations):
            trainer.iterate(lr)
        trainer.env.backend.synchronize()
        best = min(best, time.perf_counter() - began)
        windows += 1
    return {"env_steps_per_s": round(iterations * t.steps_per_iteration / best, 1),
            "iterations": iterations, "windows": windows}
