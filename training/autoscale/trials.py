"""Auto-scale trials: a short training run of one size, timed after its warm-up."""
from __future__ import annotations

import time
from dataclasses import replace

from gpusim.backends import kernels_built

from ..loop import Trainer

MAX_WARM_UP_ITERATIONS = 3


def compiles_so_far() -> int:
    """Kernels built in this process: a trial of a new size that adds to it compiled
    something the first trial did not (trials run uncompiled: torch.compile makes none)."""
    return kernels_built()


def training_trial(resize, env_class, context, seconds: float, same_iterations=False):
    """Body of a throughput trial: train for `seconds` the config `resize(value)` gives,
    uncompiled (every trial reuses what the first one built). `same_iterations`: every
    trial after the first runs as many iterations as the first did, so all cover the same
    part of their episodes (an iteration's cost changes within an episode: tag_continuous's
    updates shrink as runners leave play, 4x from its first iterations to its 12th)."""
    first = {}

    def body(value: int) -> dict:
        config = resize(value)  # (no score replicas: the trial times training alone)
        config = replace(config, trainer=replace(config.trainer, compile="off", score_envs=0,
                                                 target_score=None))
        before = compiles_so_far()
        trainer = Trainer(config, env_class, context.alone())
        if first:
            measured = measure_training(trainer, iterations=first["iterations"])
        else:
            measured = measure_training(trainer, seconds=seconds)
            if same_iterations:
                first["iterations"] = measured["iterations"]
        return dict(measured, compiles=compiles_so_far() - before)
    return body


def measure_training(trainer: Trainer, iterations: int | None = None,
                     seconds: float | None = None) -> dict:
    """Steady env-steps/s after the warm-up, over `iterations` or at least `seconds` (one
    iteration at least), and the time split."""
    lr = trainer.config.trainer.lr
    warm_up = 0
    while warm_up == 0 or (trainer.algorithm.warming_up() and warm_up < MAX_WARM_UP_ITERATIONS):
        trainer.iterate(lr)  # compiles, captures graphs, grows the allocator's pools
        warm_up += 1
    trainer.env.backend.synchronize()
    trainer.timer.reset()
    start = time.perf_counter()
    done = 0
    while done < (iterations or 1) or (seconds and time.perf_counter() - start < seconds):
        trainer.iterate(lr)  # its statistics are read on the host: each iteration syncs
        done += 1
    trainer.env.backend.synchronize()
    elapsed = time.perf_counter() - start
    shares = {k: round(v / elapsed, 3) for k, v in trainer.timer.totals().items()}
    steps = done * trainer.config.trainer.steps_per_iteration
    return {"env_steps_per_s": round(steps / elapsed, 1), "iterations": done,
            "time_share": shares}
