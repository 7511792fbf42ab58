"""`scale.objective: time_to_score`: the num_envs that reaches the recipe's score soonest.

A size's time to the score is the env steps it needs over its throughput,

    T(n) = E(n / n0) / throughput(n),

throughput measured by training trials of the size as the replica rule resizes it
(training.replicas), E(k) the env steps the recipe needs at k x its replicas. Where the
recipe ships E(k) (training.env_steps: measured over seeds, in env steps, so on any
device), that is E. Where it ships none, E comes from the gradient noise scale B_noise
(McCandlish et al. 2018): with B the env steps per iteration over the recipe's
minibatches (what a gradient step would see at the recipe's pace),

    E(B) = total_steps (1 + B / B_noise) / (1 + B0 / B_noise),

anchored at the recipe's budget; B_noise is `scale.noise_scale`, or measured in a short
trial at initialisation (smaller than later in a run), and the search says which.

The sizes tried are those E was measured at (the recipe's num_envs x each k of its
table), or, with the noise-scale model, doublings. The search (gpusim.scale.size_search.quickest)
measures from the recipe's num_envs down and up while the prediction improves, and picks,
among the sizes predicted within `scale.slack` of the quickest, the one nearest the
recipe: steady from run to run. Every trial times the same steps of its episodes (the
first rollout of the recipe's, from a reset: training.autoscale.trials), so sizes whose
rollouts the replica rule shortened are compared like for like.
"""
from __future__ import annotations

from dataclasses import replace

from gpusim.errors import GpusimError
from gpusim.scale.size_search import doublings

from .. import env_steps
from ..loop import Trainer
from .trials import training_trial

NOISE_TRIAL_ITERATIONS = 8  # iterations of the trial that measures B_noise when not given


def gradient_batch(config, recipe) -> float:
    """Env steps per iteration over the recipe's minibatches per iteration."""
    return config.trainer.steps_per_iteration / getattr(recipe.algo, "num_minibatches", 1)


def noise_model(config, recipe, noise_scale: float):
    """E(n) of the noise-scale model, anchored at the recipe's budget."""
    b0 = gradient_batch(recipe, recipe)

    def steps(resized) -> float:
        b = gradient_batch(resized, recipe)
        return recipe.trainer.total_steps * (1 + b / noise_scale) / (1 + b0 / noise_scale)
    return steps


def measured_noise_scale(config, env_class, context) -> float:
    """B_noise from a short run of the recipe measuring it at every iteration (the
    largest over its policies: the most data-hungry decides)."""
    trial = replace(config, trainer=replace(config.trainer, compile="off", score_envs=0,
                                            target_score=None),
                    algo=replace(config.algo, noise_scale_every=1))
    trainer = Trainer(trial, env_class, context.alone())
    found = {}
    for _ in range(NOISE_TRIAL_ITERATIONS):
        for name, stats in trainer.iterate(config.trainer.lr).items():
            if "noise_scale_run" in stats:
                found[name] = stats["noise_scale_run"]
    if not found:
        raise GpusimError("auto-scale (time_to_score): the gradient noise scale could not be "
                          f"measured in {NOISE_TRIAL_ITERATIONS} iterations of "
                          f"{config.env_name}; give scale.noise_scale")
    return max(found.values())


def steps_needed(auto):
    """(E as a function of a resized config, where it comes from, the replica counts it
    was measured at or None), said once."""
    config, scale = auto.config, auto.config.scale
    table = env_steps.table_for(config)
    if table is not None:
        auto.say(f"env steps to the score at k x the replicas: measured, {table.source}")
        n0 = config.trainer.num_envs
        measured = [round(n0 * k) for k, e in table.rows if e is not None and n0 * k >= 1]
        return (lambda resized: table.at(resized.trainer.num_envs / n0)), table.source, measured
    if not hasattr(config.algo, "noise_scale_every"):
        raise GpusimError(f"scale.objective time_to_score sizes PPO and A2C runs; use "
                          f"throughput for {config.trainer.algorithm}")
    noise = scale.noise_scale
    source = "the recipe's scale.noise_scale"
    if noise is None:
        noise = measured_noise_scale(config, auto.env_class, auto.context)
        source = (f"measured in {NOISE_TRIAL_ITERATIONS} iterations at initialisation (smaller "
                  "than later in a run: set scale.noise_scale)")
    auto.report["noise_scale"] = round(noise, 1)
    auto.say(f"no measured env steps for this recipe (training.env_steps): they are "
             f"modelled from the gradient noise scale, {noise:,.0f} env steps per gradient "
             f"step, {source}")
    return noise_model(config, config, noise), f"noise scale {noise:,.0f}, {source}", None


def to_score(auto) -> object:
    """The config sized for the least predicted time to the score (an AutoScale `auto`)."""
    config, scale, t = auto.config, auto.config.scale, auto.config.trainer
    steps, source, measured = steps_needed(auto)

    def predicted_s(num_envs, rate):
        needed = steps(auto.sized(num_envs))
        if needed is None:
            auto.say(f"    -> num_envs={num_envs}: the recipe did not reach its score at this "
                     "size (training.env_steps)")
            return None
        seconds = needed / rate
        auto.say(f"    -> num_envs={num_envs}: {needed:,.0f} env steps to the score; "
                 f"predicted {seconds:,.1f} s")
        return seconds

    lowest = max(1, -(-getattr(config.algo, "num_minibatches", 1) // t.rollout_len))
    if measured is None:
        sizes = doublings(t.num_envs, scale.max_num_envs, lowest)
    else:
        sizes = sorted({n for n in measured if lowest <= n <= scale.max_num_envs} | {t.num_envs})
    auto.say(f"search: num_envs among {', '.join(map(str, sizes))}, from {t.num_envs} down and "
             f"up while the predicted time to the score improves (ties within "
             f"{scale.slack:.0%}: the nearest the config); each trial times the first "
             f"{t.rollout_len} steps of its episodes")
    searcher = auto.searcher("num_envs", training_trial(
        auto.sized, auto.env_class, auto.context, scale.trial_seconds,
        episode_steps=t.rollout_len), scale.max_num_envs)
    outcome = searcher.run_quickest(predicted_s, t.num_envs, sizes, scale.slack)
    auto.say(f"search stopped: {outcome.why}")
    num_envs = auto.agree("num_envs", outcome.pick)
    if num_envs == 0:
        raise GpusimError(f"auto-scale: the config's own num_envs={t.num_envs} does not fit in "
                          "the budget; lower it or raise --memory_budget")
    auto.record("num_envs", searcher)
    auto.report.update(env_steps_source=source,
                       predicted_s={v: round(s, 2) for v, s in outcome.times.items()
                                    if s is not None},
                       stopped_because=outcome.why)
    return auto.sized(num_envs)
