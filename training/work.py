"""What one iteration asks of the CPU: the input of the thread choice (gpusim.scale.threads).

Rough sizes are enough: the choice compares them with thresholds a factor
of four or more away from where a second thread starts to pay.
"""
from __future__ import annotations

from gpusim.scale.threads import Work

from .population import members as population


def largest_layer(spec, hidden_sizes) -> int:
    """Multiply-adds per row of a policy network's largest layer (actor or critic)."""
    sizes = (spec.obs_dim + spec.action_width, *hidden_sizes, 1)
    return max(a * b for a, b in zip(sizes, sizes[1:]))


def update_rows(config, rollout_rows: int) -> int:
    """Rows in one training chunk: an off-policy algorithm's batch (`batch_size`, shared by
    the ranks), else a minibatch (`num_minibatches` of the rollout, capped at
    `max_minibatch_rows`); the rollout's rows for an algorithm that has neither."""
    algo = config.algo
    if hasattr(algo, "batch_size"):
        return algo.batch_size
    if hasattr(algo, "num_minibatches"):
        rows = rollout_rows * config.trainer.rollout_len // algo.num_minibatches
        return min(rows, getattr(algo, "max_minibatch_rows", rows))
    return rollout_rows


def run_work(config, env) -> Work:
    """The work of `config`'s training on `env` (this rank's replicas)."""
    t = config.trainer
    rollout = update = 0
    for spec in env.policy_specs.values():
        layer = largest_layer(spec, config.policy.hidden_sizes)
        rows = env.num_envs * spec.num_agents  # a population: every member's
        rollout = max(rollout, rows * layer)
        update = max(update, update_rows(config, rows) * layer)
    return Work(rollout_macs=rollout, update_macs=update,
                env_obs_values=env.num_envs * env.num_agents * env.obs_dim,
                members=population.size(t))
