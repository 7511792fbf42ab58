"""`scale.objective: time_to_score`: the num_envs that reaches the recipe's score soonest.

Throughput is half of it. The other half is how many env steps learning needs at a
batch: past the gradient noise scale B_noise, more data per gradient step stops buying
fewer steps (McCandlish et al. 2018), so the env steps to a score grow with the batch,

    E(B) = E_min (1 + B / B_noise),   B: env steps per gradient step (a minibatch),

and the time to the score is E(B) over the throughput at B. Anchored at the recipe (its
step budget E(B0) at its batch B0), a size's predicted time is

    T(n) = total_steps * (1 + B(n) / B_noise) / (1 + B0 / B_noise) / throughput(n).

The search (gpusim.scale.search.quickest) measures throughput by training trials, as
the throughput objective does, from the recipe's num_envs down and up by doublings
while the prediction improves, and picks, among the sizes predicted within
`scale.slack` of the quickest, the one nearest the recipe: steady from run to run.
The learning settings follow the batch (`PPOConfig.for_batch`: the recipe's gradient
steps per iteration on larger minibatches), and the step budget follows E(B), unless
the user gave `--total_steps`. B_noise is the recipe's measured value
(`scale.noise_scale`, from `trainer.noise_scale_every` over a run); without one it is
measured in a short trial at initialisation, where it is smaller than later in a run.
"""
from __future__ import annotations

from dataclasses import replace

from gpusim.errors import GpusimError

from ..loop import Trainer
from .trials import training_trial

NOISE_TRIAL_ITERATIONS = 8  # iterations of the trial that measures B_noise when not given


def gradient_batch(config) -> float:
    """Env steps per gradient step: a minibatch of the rollout."""
    t = config.trainer
    return t.num_envs * t.rollout_len / getattr(config.algo, "num_minibatches", 1)


def steps_to_score(config, recipe, noise_scale: float) -> int:
    """The env steps `config` needs where `recipe` needs its total_steps (E(B) above)."""
    b, b0 = gradient_batch(config), gradient_batch(recipe)
    return int(recipe.trainer.total_steps * (1 + b / noise_scale) / (1 + b0 / noise_scale))


def measured_noise_scale(config, env_class, context) -> float:
    """B_noise from a short run of the recipe measuring it at every iteration (the
    largest over its policies: the most data-hungry decides)."""
    trial = replace(config, trainer=replace(config.trainer, compile="off", score_envs=0),
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


def to_score(auto) -> object:
    """The config sized for the least predicted time to the score (an AutoScale `auto`)."""
    config, scale, t = auto.config, auto.config.scale, auto.config.trainer
    if not hasattr(config.algo, "noise_scale_every"):
        raise GpusimError(f"scale.objective time_to_score sizes PPO and A2C runs; use "
                          f"throughput for {t.algorithm}")
    noise = scale.noise_scale
    source = "the recipe's scale.noise_scale"
    if noise is None:
        noise = measured_noise_scale(config, auto.env_class, auto.context)
        source = (f"measured in {NOISE_TRIAL_ITERATIONS} iterations at initialisation (smaller "
                  "than later in a run: set scale.noise_scale)")
    auto.say(f"gradient noise scale {noise:,.0f} env steps per gradient step, {source}")

    def resize(num_envs):
        return auto.sized(num_envs=num_envs, rollout_len=t.rollout_len)

    def predicted_s(num_envs, rate):
        seconds = steps_to_score(resize(num_envs), config, noise) / rate
        auto.say(f"    -> num_envs={num_envs}: {gradient_batch(resize(num_envs)):,.0f} env "
                 f"steps per gradient step; predicted {seconds:,.1f} s to the score")
        return seconds

    auto.say(f"search: num_envs from {t.num_envs}, down and up by doublings while the "
             f"predicted time to the score improves (ties within {scale.slack:.0%}: the "
             "nearest the config)")
    searcher = auto.searcher("num_envs", training_trial(
        resize, auto.env_class, auto.context, scale.trial_seconds, same_iterations=True),
        scale.max_num_envs)
    lowest = max(1, -(-getattr(config.algo, "num_minibatches", 1) // t.rollout_len))
    outcome = searcher.run_quickest(predicted_s, t.num_envs, scale.slack, lowest)
    auto.say(f"search stopped: {outcome.why}")
    num_envs = auto.agree("num_envs", outcome.pick)
    if num_envs == 0:
        raise GpusimError(f"auto-scale: the config's own num_envs={t.num_envs} does not fit in "
                          "the budget; lower it or raise --memory_budget")
    auto.record("num_envs", searcher, rollout_len=t.rollout_len)
    picked = resize(num_envs)
    total = picked.trainer.total_steps if auto.keep_total_steps \
        else steps_to_score(picked, config, noise)
    auto.report.update(noise_scale=round(noise, 1), noise_scale_source=source,
                       predicted_s={v: round(s, 2) for v, s in outcome.times.items()
                                    if s is not None},
                       stopped_because=outcome.why, total_steps_config=t.total_steps)
    if total != t.total_steps:
        auto.say(f"total_steps {t.total_steps:,} -> {total:,}: the steps the score needs at "
                 f"this batch (--total_steps keeps a budget of steps)")
    return replace(picked, trainer=replace(picked.trainer, total_steps=total))
