"""`--auto_scale`: size a run to its device before training starts.

Objective `throughput` (the default): the fastest training, measured.
Every trial is a short training run (one warm-up iteration, then
`scale.trial_iterations` timed ones) that reports its steady env-steps/s
and its peak memory.
0. The run's own config is measured first: the baseline of the report.
1. Rollout: `rollout_len` is the config's, raised to the learning floor
   `scale.min_rollout_len` (capped at the env's time limit).
2. Replicas: `num_envs` doubles while the doubled run fits and is at least
   `scale.saturation` faster, then the last bracket is bisected.
3. Minibatch rows: where a minibatch exceeds `trainer.max_minibatch_rows`
   (the chunk search 1 ran with, so it fits), the chunk doubles while it
   fits and gains `scale.saturation`, up to the largest minibatch.
Objective `memory`: the largest `num_envs` for which building the env, a
reset and a few steps fit in `env_share` of the usable memory, then the
largest `rollout_len` for which a full iteration fits (if that is shorter
than the floor, `num_envs` is halved and the batch search runs again).

Usable memory is the budget (`--memory_budget`, else free GPU memory, else a
share of free RAM) less the headroom. With several ranks every rank searches
its own device and all take the minimum. The report (picks, every trial
with its throughput and peak memory, the speed-up over the config) is
printed and saved in the run's config.yaml.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from gpusim.check.compare import actions_to, random_actions
from gpusim.errors import GpusimError
from gpusim.scale import distributed as dist
from gpusim.scale.search import Searcher
from gpusim.sizes import format_size, parse_size

from .acceleration import forget_compiled
from .algorithms import ALGORITHMS, algorithm_class
from .config import RunConfig
from .loop import Trainer

TRAINER_SIZES = ("num_envs", "rollout_len")  # the rest (max_minibatch_rows) are the algorithm's
HEADLINE_SPEEDUP = 1.5  # what auto-scaling should gain over the config, or say why not


def budget_bytes(config: RunConfig, context) -> int:
    scale = config.scale
    if scale.memory_budget is not None:
        return parse_size(scale.memory_budget)
    return context.default_budget(scale.cpu_memory_fraction)


def with_sizes(config: RunConfig, **sizes) -> RunConfig:
    """`config` with trainer sizes replaced (minibatches capped at the batch's rows)."""
    t = replace(config.trainer, **{k: v for k, v in sizes.items() if k in TRAINER_SIZES})
    algo = replace(config.algo, **{k: v for k, v in sizes.items() if k not in TRAINER_SIZES})
    algo = replace(algo, num_minibatches=min(algo.num_minibatches, t.num_envs * t.rollout_len))
    return replace(config, trainer=t, algo=algo)


def rollout_floor(config: RunConfig, time_limit: int | None) -> int:
    """The config's rollout_len, raised to scale.min_rollout_len capped at the time limit."""
    floor = config.scale.min_rollout_len
    if time_limit is not None:
        floor = min(floor, time_limit)
    return min(max(config.trainer.rollout_len, floor), config.scale.max_rollout_len)


# ---- trials ------------------------------------------------------------------------
def training_trial(config: RunConfig, env_class, context, size_key: str, **fixed):
    """Body of a throughput trial: train briefly with `size_key` set to the trial's value."""
    def body(value: int) -> dict:
        forget_compiled()
        trainer = Trainer(with_sizes(config, **fixed, **{size_key: value}), env_class,
                          context.alone())
        return measure_training(trainer, config.scale.trial_iterations)
    return body


def measure_training(trainer: Trainer, iterations: int) -> dict:
    """Steady env-steps/s after one warm-up iteration, and the time split."""
    lr = trainer.config.trainer.lr
    trainer.iterate(lr)  # warm-up: compiles, grows the allocator's pools
    trainer.env.backend.synchronize()
    trainer.timer.reset()
    start = time.perf_counter()
    for _ in range(iterations):
        trainer.iterate(lr)
    trainer.env.backend.synchronize()
    seconds = time.perf_counter() - start
    shares = {k: round(v / seconds, 3) for k, v in trainer.timer.totals().items()}
    steps = iterations * trainer.config.trainer.steps_per_iteration
    return {"env_steps_per_s": round(steps / seconds, 1), "time_share": shares}


def env_trial(config: RunConfig, env_class, context, steps: int):
    """Body of a memory-objective replica trial: build, reset, step with random actions."""
    backend = context.backend

    def body(num_envs: int) -> dict:
        env = env_class(num_envs=num_envs, backend=backend, seed=config.trainer.seed,
                        config=config.env, env_offset=context.replica_offset(num_envs))
        env.reset()
        actions = actions_to(random_actions(torch.Generator().manual_seed(0), env), env.device)
        start = time.perf_counter()
        for _ in range(steps):
            env.step(actions)
        backend.synchronize()
        return {"env_steps_per_s": round(num_envs * steps / (time.perf_counter() - start), 1)}
    return body


def iteration_trial(config: RunConfig, env_class, context, num_envs: int):
    """Body of a memory-objective batch trial: one full iteration with `rollout_len` steps."""
    def body(rollout_len: int) -> dict:
        trainer = Trainer(with_sizes(config, num_envs=num_envs, rollout_len=rollout_len),
                          env_class, context.alone())
        start = time.perf_counter()
        trainer.iterate(config.trainer.lr)
        context.backend.synchronize()
        return {"env_steps_per_s": round(num_envs * rollout_len / (time.perf_counter() - start),
                                         1)}
    return body


# ---- the searches --------------------------------------------------------------------
class AutoScale:
    """One auto-scale: the budget, the time limit, and what each search found."""

    def __init__(self, config: RunConfig, env_class, context, log=print):
        self.config = config
        self.env_class = env_class
        self.context = context
        self.say = log if context.is_main else (lambda *a, **k: None)
        self.budget = budget_bytes(config, context)
        self.limit = int(self.budget * (1 - config.scale.headroom))
        self.start = time.perf_counter()
        self.report = {"device": str(context.backend.device), "processes": context.world_size,
                       "objective": config.scale.objective, "budget_bytes": self.budget,
                       "usable_bytes": self.limit, "trials": {}}

    def time_left(self) -> float:  # one time limit for the whole auto-scale
        return max(0.0, self.config.scale.time_limit_s - (time.perf_counter() - self.start))

    def searcher(self, name: str, body, cap: int, limit: int | None = None) -> Searcher:
        return Searcher(name, body, self.context.backend, self.limit if limit is None else limit,
                        cap, self.time_left(), self.say)

    def agree(self, name: str, value: int) -> int:
        """The smallest `value` over all ranks, once every rank has finished its search
        (they take different times: a store barrier waits, not a collective's timeout)."""
        scale = self.config.scale
        dist.wait_for_all(f"auto-scale {name}", scale.time_limit_s + scale.timeout_s)
        return dist.min_across(value)

    def record(self, key: str, searcher: Searcher, **extra):
        self.report["trials"].setdefault(key, []).extend(
            dict(t.to_dict(), **extra) for t in searcher.trials)

    def run(self) -> RunConfig:
        scale = self.config.scale
        self.say(f"auto-scale ({scale.objective}) on {self.context.backend.device}: budget "
                 f"{format_size(self.budget)}, usable {format_size(self.limit)} "
                 f"(headroom {scale.headroom:g})")
        config = self.fastest() if scale.objective == "throughput" else self.largest()
        forget_compiled()  # the run compiles afresh, not after the trials' compiles
        t, rows = config.trainer, config.algo.max_minibatch_rows
        self.report.update(num_envs=t.num_envs, rollout_len=t.rollout_len,
                           max_minibatch_rows=rows,
                           search_s=round(time.perf_counter() - self.start, 2))
        self.say(f"auto-scale picked num_envs={t.num_envs}, rollout_len={t.rollout_len}, "
                 f"max_minibatch_rows={rows} (train batch "
                 f"{t.steps_per_iteration:,} env steps) in {self.report['search_s']:.1f} s")
        return replace(config, auto_scale_report=self.report)

    # ---- objective: throughput -------------------------------------------------------
    def fastest(self) -> RunConfig:
        config, scale = self.config, self.config.scale
        t = config.trainer
        env = self.env_class(num_envs=1, backend=self.context.backend, seed=t.seed,
                             config=config.env)  # its sizes (and its kernels, compiled once)
        largest_policy = max(len(ids) for ids in env.policies.values())
        rollout_len = self.agree("rollout_len", rollout_floor(config, env.time_limit))

        self.say(f"baseline: the config's num_envs={t.num_envs}, rollout_len={t.rollout_len}")
        baseline = self.searcher("num_envs", training_trial(
            config, self.env_class, self.context, "num_envs", rollout_len=t.rollout_len),
            scale.max_num_envs)
        base = baseline.measure(t.num_envs)
        self.record("baseline", baseline)
        if not base.ok:
            raise GpusimError(f"auto-scale: the config's own num_envs={t.num_envs} and "
                              f"rollout_len={t.rollout_len} do not fit in "
                              f"{format_size(self.limit)} ({base.note}); lower them or raise "
                              "--memory_budget")

        self.say(f"search 1: num_envs in [1, {scale.max_num_envs}] with rollout_len="
                 f"{rollout_len}, doubling while it fits and gains >= {scale.saturation:.0%}")
        replicas = self.searcher("num_envs", training_trial(
            config, self.env_class, self.context, "num_envs", rollout_len=rollout_len),
            scale.max_num_envs)
        own_pick = replicas.run_fastest(scale.saturation)
        num_envs = self.agree("num_envs", own_pick)
        self.record("num_envs", replicas, rollout_len=rollout_len)
        if num_envs == 0:
            raise GpusimError(f"auto-scale: not even one replica of {config.env_name} trains "
                              f"within {format_size(self.limit)}; raise --memory_budget")
        picked = with_sizes(config, num_envs=num_envs, rollout_len=rollout_len)
        # the picked run's trial (measured here if it is another rank's smaller pick)
        final = replicas.trial(num_envs) or replicas.measure(num_envs)

        rows = self.minibatch_rows(picked, largest_policy)
        if rows is not None:
            picked = with_sizes(picked, max_minibatch_rows=rows.value)
            final = rows
        self.report.update(num_envs_rank0_pick=own_pick,
                           baseline_env_steps_per_s=base.info["env_steps_per_s"])
        self.speedup(base.info["env_steps_per_s"], final.info, replicas, num_envs)
        return picked

    def minibatch_rows(self, config: RunConfig, largest_policy: int):
        """The trial of larger minibatch chunks, where minibatches exceed the configured chunk.

        Search 1 ran with the config's `max_minibatch_rows`, so those chunks fit.
        Larger ones mean fewer, bigger launches: double them while they fit and
        gain (powers of two only: no bisection), up to the largest minibatch.
        """
        scale, t, algo = config.scale, config.trainer, config.algo
        largest = t.num_envs * t.rollout_len * largest_policy // algo.num_minibatches
        if largest <= algo.max_minibatch_rows:
            return None  # every minibatch is already one chunk
        self.say(f"search 2: max_minibatch_rows in [{algo.max_minibatch_rows}, {largest}], "
                 "doubling while it fits and gains")
        rows = self.searcher("max_minibatch_rows", training_trial(
            config, self.env_class, self.context, "max_minibatch_rows",
            num_envs=t.num_envs, rollout_len=t.rollout_len), largest)
        pick = self.agree("max_minibatch_rows", rows.run_fastest(
            scale.saturation, start=algo.max_minibatch_rows, resolution=1.0))
        self.record("max_minibatch_rows", rows, num_envs=t.num_envs)
        return (rows.trial(pick) or rows.measure(pick)) if pick else None

    def speedup(self, baseline: float, final: dict, replicas: Searcher, num_envs: int):
        """Report the gain over the config; below the headline target, say why."""
        rate = final["env_steps_per_s"]
        ratio = rate / baseline if baseline else float("inf")
        self.report.update(trial_env_steps_per_s=rate, speedup_over_config=round(ratio, 2))
        self.say(f"picked run: {rate:,.0f} env steps/s per process in its trial, "
                 f"{ratio:.2f}x the config's {baseline:,.0f}")
        if ratio >= HEADLINE_SPEEDUP:
            return
        larger = [t for t in replicas.trials if t.value > num_envs]
        if larger and not any(t.ok for t in larger):
            why = (f"num_envs={min(t.value for t in larger)} did not fit in "
                   f"{format_size(self.limit)}")
        else:
            shares = final.get("time_share", {})
            learner = shares.get("forward", 0) + shares.get("update", 0)
            why = (f"throughput saturated: doubling num_envs gained less than "
                   f"{self.config.scale.saturation:.0%}; the learner (policy forward and "
                   f"update) takes {learner:.0%} of the picked run's time and the env "
                   f"{shares.get('env', 0):.0%}, so larger batches do not train faster on "
                   f"{self.context.backend.device}")
        self.report["why_not_faster"] = why
        self.say(f"below {HEADLINE_SPEEDUP}x the config because {why}")

    # ---- objective: memory -----------------------------------------------------------
    def largest(self) -> RunConfig:
        config, scale = self.config, self.config.scale
        env_limit = int(self.limit * scale.env_share)
        self.report["env_limit_bytes"] = env_limit
        self.say(f"search 1: num_envs in [1, {scale.max_num_envs}]; replicas may fill "
                 f"{format_size(env_limit)}")
        replicas = self.searcher("num_envs", env_trial(config, self.env_class, self.context,
                                                       scale.env_trial_steps),
                                 scale.max_num_envs, env_limit)
        own_pick = replicas.run()
        num_envs = self.agree("num_envs", own_pick)
        self.record("num_envs", replicas)
        if num_envs == 0:
            raise GpusimError(f"auto-scale: not even one replica of {config.env_name} fits in "
                              f"{format_size(env_limit)}; raise --memory_budget")
        self.report.update(num_envs_search_pick=num_envs, num_envs_rank0_pick=own_pick)
        while True:
            self.say(f"search 2: rollout_len in [1, {scale.max_rollout_len}] with "
                     f"num_envs={num_envs}")
            batches = self.searcher("rollout_len", iteration_trial(
                config, self.env_class, self.context, num_envs), scale.max_rollout_len)
            rollout_len = self.agree("rollout_len", batches.run())
            self.record("rollout_len", batches, num_envs=num_envs)
            if rollout_len >= scale.min_rollout_len:
                break
            out_of_time = self.agree("time left", int(self.time_left() > 0)) == 0
            if rollout_len > 0 and out_of_time:
                self.say(f"  scale.time_limit_s={scale.time_limit_s:g} reached: keeping "
                         f"rollout_len {rollout_len} < scale.min_rollout_len")
                break
            # The replicas leave too little room for training batches: halve them.
            if num_envs == 1:
                raise GpusimError(f"auto-scale: a training iteration of {config.env_name} with "
                                  f"rollout_len={scale.min_rollout_len} does not fit in "
                                  f"{format_size(self.limit)}; raise --memory_budget or lower "
                                  f"scale.min_rollout_len")
            num_envs //= 2
            self.say(f"  rollout_len {rollout_len} < scale.min_rollout_len="
                     f"{scale.min_rollout_len}: num_envs -> {num_envs}")
        picked = batches.trial(rollout_len)
        self.report["trial_env_steps_per_s"] = picked.info.get("env_steps_per_s") \
            if picked is not None else None
        return with_sizes(config, num_envs=num_envs, rollout_len=rollout_len)


def auto_scale(config: RunConfig, env_class, context, log=print) -> RunConfig:
    """`config` with the picked sizes, and the search's report."""
    if not algorithm_class(config.trainer.algorithm).auto_scales:
        scalable = ", ".join(name for name, cls in ALGORITHMS.items() if cls.auto_scales)
        raise GpusimError(f"--auto_scale sizes on-policy rollouts ({scalable}); "
                          f"{config.trainer.algorithm} sets its pace with trainer.replay_ratio "
                          "and batch_size: drop --auto_scale")
    return AutoScale(config, env_class, context, log).run()
