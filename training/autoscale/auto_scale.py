"""`--auto_scale`: size a run to its device before training starts.

The training layer of auto-scaling: it builds the trials (training runs, env builds)
that the generic searches of gpusim.scale.size_search pick among.

Whatever the objective, a size is the config at that many replicas with what follows
them (training.replicas: the rollout shortens to hold the recipe's batch down to a
floor, then minibatches of the recipe's size are added, and the budget keeps the
recipe's iterations; `--total_steps` keeps a budget of steps). Every trial is a short
training run: a warm-up (one iteration, and on a GPU the one that captures the CUDA
graphs), then `scale.trial_seconds` of timed training, reporting steady env-steps/s and
peak memory. Trials run the uncompiled step (graph-captured on a GPU): no trial compiles
anything the first did not, and the pick alone compiles, once, when it trains.

Objective `time_to_score` (the default; to_score): the size predicted to reach the
recipe's score soonest, the env steps it needs (measured per recipe: training.env_steps)
over its measured throughput.
Objective `throughput`: the fastest training, whatever the env steps a size needs.
0. The run's config as given is measured first: the baseline.
1. Replicas: from the config's `num_envs`, x`scale.growth` per step while the
   step fits (within the memory the trials so far were measured to need) and
   gains at least `scale.saturation` per doubling; then the last bracket is
   refined at its geometric midpoint.
2. Minibatch rows: where a minibatch exceeds `trainer.max_minibatch_rows`
   (the chunk search 1 ran with, so it fits), the chunk doubles while it
   fits and gains `scale.saturation`, up to the largest minibatch.
The pick is never slower than the baseline: a search that found nothing
faster keeps the config, and says why it stopped.
Objective `memory`: the largest `num_envs` for which building the env, a
reset and a few steps fit in `env_share` of the usable memory, then the
largest `rollout_len` for which a full iteration fits (if that is shorter
than the floor, `num_envs` is halved and the batch search runs again).

Usable memory is the budget (`--memory_budget`, else free GPU memory, else a
share of free RAM) less the headroom. With several ranks every rank searches
its own device and all take the minimum. The report (picks, every trial
with its time, throughput, peak memory and compiles, the speed-up over the
config, why the search stopped) is printed and saved in the run's config.yaml.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from gpusim.check.compare import actions_to, random_actions
from gpusim.errors import GpusimError
from gpusim.scale import distributed as dist
from gpusim.scale.size_search import Searcher
from gpusim.sizes import format_size, parse_size

from .. import replicas
from ..algorithms import ALGORITHMS, algorithm_class
from ..loop import Trainer
from ..run_config import RunConfig
from .to_score import to_score
from .trials import compiles_so_far, training_trial

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

    def __init__(self, config: RunConfig, env_class, context, log=print,
                 given: frozenset = frozenset()):
        if config.scale.objective == "auto":  # (the same on every device: E(k) is counted
            # in env steps, the throughput measured where the run trains)
            config = replace(config, scale=replace(config.scale, objective="time_to_score"))
        self.config = config
        self.env_class = env_class
        self.context = context
        self.given = given  # dotted keys the user set: the replica rule leaves them
        self.say = log if context.is_main else (lambda *a, **k: None)
        self.budget = budget_bytes(config, context)
        self.limit = int(self.budget * (1 - config.scale.headroom))
        self.start = time.perf_counter()
        self.agents = 1  # the largest policy's agents per replica (set by the search)
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

    def sized(self, num_envs: int, rollout_len: int | None = None) -> RunConfig:
        """The config at `num_envs` replicas, with what follows them (training.replicas;
        a `rollout_len` of the memory search's, the rest following)."""
        return replicas.follow(self.config, num_envs, self.given, rollout_len).config

    def run(self) -> RunConfig:
        scale = self.config.scale
        self.say(f"auto-scale ({scale.objective}) on {self.context.backend.device}: budget "
                 f"{format_size(self.budget)}, usable {format_size(self.limit)} "
                 f"(headroom {scale.headroom:g})")
        compiles = compiles_so_far()
        env = self.env_class(num_envs=1, backend=self.context.backend, seed=self.config.trainer.seed,
                             config=self.config.env)  # its sizes (and its kernels, compiled once)
        self.agents = max(len(ids) for ids in env.policies.values())
        del env
        if scale.objective == "time_to_score":
            config = to_score(self)
        else:
            config = self.fastest() if scale.objective == "throughput" else self.largest()
        t, algo = config.trainer, config.algo
        self.report.update(num_envs=t.num_envs, rollout_len=t.rollout_len,
                           max_minibatch_rows=algo.max_minibatch_rows,
                           num_minibatches=getattr(algo, "num_minibatches", None),
                           total_steps=t.total_steps, compiles=compiles_so_far() - compiles,
                           search_s=round(time.perf_counter() - self.start, 2))
        self.say(f"auto-scale picked num_envs={t.num_envs}, rollout_len={t.rollout_len}, "
                 f"max_minibatch_rows={algo.max_minibatch_rows} (train batch "
                 f"{t.steps_per_iteration:,} env steps) in {self.report['search_s']:.1f} s")
        return replace(config, auto_scale_report=self.report)

    # ---- objective: throughput -------------------------------------------------------
    def fastest(self) -> RunConfig:
        config, scale = self.config, self.config.scale
        t = config.trainer

        self.say(f"baseline: the config as given, num_envs={t.num_envs}, "
                 f"rollout_len={t.rollout_len}")
        baseline = self.searcher("num_envs", training_trial(
            lambda value: config, self.env_class, self.context, scale.trial_seconds),
            scale.max_num_envs)
        base = baseline.measure(t.num_envs)
        self.record("baseline", baseline)
        if not base.ok:
            raise GpusimError(f"auto-scale: the config's own num_envs={t.num_envs} and "
                              f"rollout_len={t.rollout_len} do not fit in "
                              f"{format_size(self.limit)} ({base.note}); lower them or raise "
                              "--memory_budget")
        base_rate = base.info["env_steps_per_s"]

        resize = self.sized
        self.say(f"search 1: num_envs from {t.num_envs}, x{scale.growth} per step up to "
                 f"{scale.max_num_envs} (the rollout and minibatches following them: "
                 f"training.replicas), while a step fits and gains >= {scale.saturation:.0%} "
                 "per doubling")
        replicas = self.searcher("num_envs", training_trial(
            resize, self.env_class, self.context, scale.trial_seconds), scale.max_num_envs)
        if resize(t.num_envs) == config:  # the baseline is the search's first point
            replicas.trials.append(base)
        outcome = replicas.run_fastest(scale.saturation, start=t.num_envs, growth=scale.growth)
        self.say(f"search 1 stopped: {outcome.why}")
        num_envs = self.agree("num_envs", outcome.pick)
        self.record("num_envs", replicas)
        picked = resize(num_envs) if num_envs else config
        # the picked run's trial (measured here if it is another rank's smaller pick)
        final = (replicas.trial(num_envs) or replicas.measure(num_envs)) if num_envs else base

        rows = self.minibatch_rows(picked) if final.ok else None
        if rows is not None and rows.ok:
            picked = with_sizes(picked, max_minibatch_rows=rows.value)
            final = rows
        rate = final.info["env_steps_per_s"] if final.ok else 0.0
        why = outcome.why
        if rate < base_rate:  # never slower than the config as given
            why = (f"{why}; the best size measured ({rate:,.0f} env steps/s) was no faster "
                   f"than the config's {base_rate:,.0f}, so the config is kept")
            picked, rate = config, base_rate
        self.report.update(num_envs_rank0_pick=outcome.pick, stopped_because=why,
                           baseline_env_steps_per_s=base_rate)
        self.speedup(base_rate, rate, why)
        return picked

    def minibatch_rows(self, config: RunConfig):
        """The trial of larger minibatch chunks, where minibatches exceed the configured chunk.

        Search 1 ran with the config's `max_minibatch_rows`, so those chunks fit.
        Larger ones mean fewer, bigger launches: double them while they fit and
        gain (powers of two only: no bisection), up to the largest minibatch.
        """
        scale, t, algo = config.scale, config.trainer, config.algo
        largest = t.num_envs * t.rollout_len * self.agents // algo.num_minibatches
        if largest <= algo.max_minibatch_rows:
            return None  # every minibatch is already one chunk
        self.say(f"search 2: max_minibatch_rows in [{algo.max_minibatch_rows}, {largest}], "
                 "doubling while it fits and gains")
        rows = self.searcher("max_minibatch_rows", training_trial(
            lambda value: with_sizes(config, max_minibatch_rows=value), self.env_class,
            self.context, scale.trial_seconds), largest)
        pick = self.agree("max_minibatch_rows", rows.run_fastest(
            scale.saturation, start=algo.max_minibatch_rows, growth=2, resolution=1.0).pick)
        self.record("max_minibatch_rows", rows, num_envs=t.num_envs)
        return (rows.trial(pick) or rows.measure(pick)) if pick else None

    def speedup(self, baseline: float, rate: float, why: str):
        """Report the gain over the config; below the headline target, say why."""
        ratio = rate / baseline if baseline else float("inf")
        self.report.update(trial_env_steps_per_s=rate, speedup_over_config=round(ratio, 2))
        self.say(f"picked run: {rate:,.0f} env steps/s per process in its trial, "
                 f"{ratio:.2f}x the config's {baseline:,.0f}")
        if ratio < HEADLINE_SPEEDUP:
            self.report["why_not_faster"] = why
            self.say(f"below {HEADLINE_SPEEDUP}x the config because the search stopped: {why}")

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
        return self.sized(num_envs=num_envs, rollout_len=rollout_len)


def auto_scale(config: RunConfig, env_class, context, log=print,
               given: frozenset = frozenset()) -> RunConfig:
    """`config` with the picked sizes, and the search's report."""
    if not algorithm_class(config.trainer.algorithm).auto_scales:
        scalable = ", ".join(name for name, cls in ALGORITHMS.items() if cls.auto_scales)
        raise GpusimError(f"--auto_scale sizes on-policy rollouts ({scalable}); "
                          f"{config.trainer.algorithm} sets its pace with trainer.replay_ratio "
                          "and batch_size: drop --auto_scale")
    t, scale = config.trainer, config.scale
    if t.num_envs > scale.max_num_envs and scale.objective != "memory":
        raise GpusimError(f"config key 'scale.max_num_envs' ({scale.max_num_envs:,}) is below "
                          f"trainer.num_envs ({t.num_envs:,}), where the search starts: raise "
                          "scale.max_num_envs or lower trainer.num_envs")
    return AutoScale(config, env_class, context, log, given).run()
