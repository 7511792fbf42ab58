"""`--auto_scale`: size a run to its device with two searches, before training starts.

1. Replicas: the largest `num_envs` for which building the env, a reset and a
   few steps fit in `env_share` of the usable memory.
2. Batch: with that `num_envs`, the largest `rollout_len` for which a full
   training iteration (rollout, then update with forward and backward) fits
   in the usable memory. If that is shorter than `min_rollout_len` (the
   policy's activations on every agent can outweigh the env's state),
   `num_envs` is halved and the batch search runs again.
Usable memory is the budget (`--memory_budget`, else free GPU memory, else a
share of free RAM) less the headroom. With several ranks every rank searches
its own device and all take the minimum. The report (picks, every trial, the
measured throughput) is saved in the run's config.yaml.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from gpusim import distributed as dist
from gpusim.autoscale import Searcher, format_size, parse_size
from gpusim.errors import GpusimError

from .config import RunConfig


def budget_bytes(config: RunConfig, context) -> int:
    scale = config.scale
    if scale.memory_budget is not None:
        return parse_size(scale.memory_budget)
    return context.default_budget(scale.cpu_memory_fraction)


def env_trial(config: RunConfig, env_class, backend, rank: int, steps: int):
    """Build `num_envs` replicas, reset, and step them with random actions."""
    def body(num_envs: int) -> dict:
        env = env_class(num_envs=num_envs, backend=backend, seed=config.trainer.seed,
                        config=config.env, env_offset=rank * num_envs)
        env.reset()
        high = torch.tensor(env.action_nvec, device=env.device)
        actions = (torch.rand((num_envs, env.num_agents, len(env.action_nvec)),
                              device=env.device) * high).to(torch.int32)
        start = time.perf_counter()
        for _ in range(steps):
            env.step(actions)
        backend.synchronize()
        return {"env_steps_per_s": round(num_envs * steps / (time.perf_counter() - start), 1)}
    return body


def iteration_trial(config: RunConfig, env_class, backend, num_envs: int):
    """One full training iteration with `rollout_len` steps on `num_envs` replicas."""
    from .trainer import Trainer

    def body(rollout_len: int) -> dict:
        t = config.trainer
        trainer_config = replace(t, num_envs=num_envs, rollout_len=rollout_len,
                                 num_minibatches=min(t.num_minibatches, num_envs * rollout_len))
        trainer = Trainer(replace(config, trainer=trainer_config), env_class, backend=backend)
        start = time.perf_counter()
        trainer.collect()
        for group in trainer.groups:
            trainer.update(group, t.lr)
        backend.synchronize()
        seconds = time.perf_counter() - start
        return {"env_steps_per_s": round(num_envs * rollout_len / seconds, 1)}
    return body


def auto_scale(config: RunConfig, env_class, context, log=print) -> RunConfig:
    """`config` with the picked `num_envs` and `rollout_len`, and the search's report."""
    scale = config.scale
    backend = context.backend
    say = log if context.is_main else (lambda *a, **k: None)
    budget = budget_bytes(config, context)
    limit = int(budget * (1 - scale.headroom))
    env_limit = int(limit * scale.env_share)
    say(f"auto-scale on {backend.device}: budget {format_size(budget)}, usable "
        f"{format_size(limit)} (headroom {scale.headroom:g}); replicas may fill "
        f"{format_size(env_limit)}")
    start = time.perf_counter()

    def time_left():  # one time limit for the whole auto-scale, halvings included
        return max(0.0, scale.time_limit_s - (time.perf_counter() - start))

    say(f"search 1: num_envs in [1, {scale.max_num_envs}]")
    replicas = Searcher("num_envs", env_trial(config, env_class, backend, context.rank,
                                              scale.env_trial_steps),
                        backend, env_limit, scale.max_num_envs, time_left(), say)
    own_pick = replicas.run()
    num_envs = dist.min_across(own_pick)
    if num_envs == 0:
        raise GpusimError(f"auto-scale: not even one replica of {config.env_name} fits in "
                          f"{format_size(env_limit)}; raise --memory_budget")

    replicas_found = num_envs
    batch_trials = []
    while True:
        say(f"search 2: rollout_len in [1, {scale.max_rollout_len}] with num_envs={num_envs}")
        batches = Searcher("rollout_len", iteration_trial(config, env_class, backend, num_envs),
                           backend, limit, scale.max_rollout_len, time_left(), say)
        rollout_len = dist.min_across(batches.run())
        batch_trials += [dict(x.to_dict(), num_envs=num_envs) for x in batches.trials]
        if rollout_len >= scale.min_rollout_len:
            break
        out_of_time = dist.min_across(int(time_left() > 0)) == 0  # all ranks decide alike
        if rollout_len > 0 and out_of_time:
            say(f"  scale.time_limit_s={scale.time_limit_s:g} reached: keeping rollout_len "
                f"{rollout_len} < scale.min_rollout_len")
            break
        # The replicas leave too little room for training batches: halve them.
        if num_envs == 1:
            raise GpusimError(f"auto-scale: a training iteration of {config.env_name} with "
                              f"rollout_len={scale.min_rollout_len} does not fit in "
                              f"{format_size(limit)}; raise --memory_budget or lower "
                              f"scale.min_rollout_len")
        num_envs //= 2
        say(f"  rollout_len {rollout_len} < scale.min_rollout_len={scale.min_rollout_len}: "
            f"num_envs -> {num_envs}")
    seconds = time.perf_counter() - start
    picked = next((t for t in batches.trials if t.ok and t.value == rollout_len), None)
    rate = picked.info.get("env_steps_per_s") if picked else None
    say(f"auto-scale picked num_envs={num_envs}, rollout_len={rollout_len} "
        f"(train batch {num_envs * rollout_len:,} env steps) in {seconds:.1f} s; "
        f"trial iteration {rate or 0:,.0f} env steps/s per process")

    t = config.trainer
    report = {
        "device": str(backend.device), "processes": context.world_size,
        "budget_bytes": budget, "usable_bytes": limit, "env_limit_bytes": env_limit,
        "num_envs": num_envs, "rollout_len": rollout_len, "search_s": round(seconds, 2),
        "num_envs_search_pick": replicas_found, "num_envs_rank0_pick": own_pick,
        "trial_env_steps_per_s": rate,
        "trials": {"num_envs": [x.to_dict() for x in replicas.trials],
                   "rollout_len": batch_trials},
    }
    trainer = replace(t, num_envs=num_envs, rollout_len=rollout_len,
                      num_minibatches=min(t.num_minibatches, num_envs * rollout_len))
    return replace(config, trainer=trainer, auto_scale_report=report)
