"""What follows the replica count: one rule, for `--num_envs` and `--auto_scale` alike.

A run given k times its recipe's replicas should learn per env step as the recipe does,
so that a device's extra throughput becomes time saved (measured on cartpole, simple_spread
and tag_continuous: docs/scaling.md, "The replica rule"). The rule keeps the recipe's
minibatch (rows per gradient step) and its gradient steps per env step, and
1. shortens the rollout to hold the recipe's env steps per iteration (rollout_len / k),
   down to a floor (`scale.min_rollout_len`; a recurrent policy's `bptt_len`, in whole
   sequences), never above the recipe's own;
2. past the floor, lets the batch grow in more minibatches of the recipe's size
   (Beukman et al. 2026: minibatch size and learning rate fixed, more minibatches);
3. keeps the learning rate and the epochs, and the recipe's iterations: `total_steps`
   grows with the batch past the floor (a cap, not a target: the run stops at its
   score), so a recipe that anneals its learning rate anneals it as the recipe does.
4. where the env names a score (gpusim.score), grows its evaluation replicas with the
   training's (`trainer.score_envs` x k, up to `trainer.score_window`): they step one chunk
   of rollout_len per iteration, so with the rollout cut to the floor a round of episodes
   spans more env steps, and the window then fills in fewer rounds (tag_continuous's
   score, at 16x its replicas, had stopped no sooner than 500 iterations).
A2C takes one gradient step per rollout: past the floor that step averages the larger
batch. The off-policy learners already count per env step (`replay_ratio` gradient steps
per env step of `batch_size` rows): only their rollout follows, to hold the env steps
between updates. A population runs the rule per member (each member is a solo run's
size); a league's pools count updates, which the rule holds until the floor. Keys the
user set are kept as set.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from gpusim.config import require

# keys the rule may set; a key the user gave is left alone
RULED = ("trainer.rollout_len", "trainer.total_steps", "trainer.num_minibatches",
         "trainer.score_envs")


@dataclass(frozen=True)
class Followed:
    """A config resized by the rule, and what followed."""
    config: object
    changes: dict    # key -> (before, after), only what the rule changed
    why: dict        # key -> the reason shown beside it

    def line(self) -> str:
        """One line: `num_envs 32 -> 512: rollout_len 64 -> 8, ... ; total_steps kept`."""
        t0, t1 = self.changes.get("num_envs", (None, None))
        parts = [f"{key} {a:,} -> {b:,}" + (f" ({self.why[key]})" if key in self.why else "")
                 for key, (a, b) in self.changes.items() if key != "num_envs"]
        if "total_steps" not in self.changes:
            parts.append("total_steps kept")
        return f"num_envs {t0:,} -> {t1:,}: " + ", ".join(parts)

    def record(self) -> dict:
        """What the run's config.yaml keeps of it (`replica_rule`)."""
        return {"line": self.line(),
                **{key: [a, b] for key, (a, b) in self.changes.items()}}


def floor(config) -> int:
    """The shortest rollout the rule goes to: scale.min_rollout_len, and for a recurrent
    policy at least one whole sequence of bptt_len."""
    low = config.scale.min_rollout_len
    if config.policy.recurrent != "none":
        bptt = config.policy.bptt_len
        low = bptt * max(1, -(-low // bptt))
    return low


def rollout_for(config, num_envs: int) -> int:
    """The rollout that holds the recipe's env steps per iteration at `num_envs`: rounded,
    at or above the floor, never above the recipe's (and a recurrent policy's a multiple
    of bptt_len)."""
    t = config.trainer
    wanted = t.rollout_len * t.num_envs / num_envs
    if t.rollout_len <= floor(config):
        return t.rollout_len
    if config.policy.recurrent != "none":
        bptt = config.policy.bptt_len
        return min(t.rollout_len, max(floor(config), bptt * round(wanted / bptt)))
    return min(t.rollout_len, max(floor(config), round(wanted)))


def follow(config, num_envs: int, given=frozenset(), rollout_len: int | None = None) -> Followed:
    """`config` (written for its own num_envs) at `num_envs` replicas per process, with
    what follows them. `given`: dotted keys the user set, which stay as set;
    `rollout_len`: a rollout chosen otherwise (the memory search's), the rest following."""
    require(num_envs >= 1, "trainer.num_envs", "must be at least 1")
    t, algo = config.trainer, config.algo
    rollout = rollout_len or (t.rollout_len if "trainer.rollout_len" in given
                              else rollout_for(config, num_envs))
    ratio = num_envs * rollout / t.steps_per_iteration  # the batch against the recipe's
    changes, why = {"num_envs": (t.num_envs, num_envs)}, {}
    if rollout != t.rollout_len:
        changes["rollout_len"] = (t.rollout_len, rollout)
        why["rollout_len"] = "the recipe's batch" if abs(ratio - 1) < 0.05 else \
            f"scale.min_rollout_len: {ratio:.3g}x the recipe's batch"
    algo_sizes = {}
    if hasattr(algo, "num_minibatches") and "trainer.num_minibatches" not in given \
            and algo.update_epochs * algo.num_minibatches > 1:  # (A2C: one gradient step)
        wanted = min(num_envs * rollout, max(1, round(algo.num_minibatches * ratio)))
        if wanted != algo.num_minibatches:  # the recipe's rows per minibatch
            algo_sizes["num_minibatches"] = wanted
            changes["num_minibatches"] = (algo.num_minibatches, wanted)
            why["num_minibatches"] = "the recipe's minibatch"
    score_envs = t.score_envs
    if "trainer.score_envs" not in given and t.score_envs > 0 and _scored(config):
        score_envs = max(1, min(round(t.score_envs * num_envs / t.num_envs),
                                max(t.score_envs, t.score_window)))
        if score_envs != t.score_envs:
            changes["score_envs"] = (t.score_envs, score_envs)
            why["score_envs"] = "the score's evaluation replicas, up to its window"
    total = t.total_steps
    if ratio > 1 and "trainer.total_steps" not in given:
        total = round(t.total_steps * ratio)
        changes["total_steps"] = (t.total_steps, total)
        why["total_steps"] = f"the recipe's {t.num_iterations():,} iterations"
    resized = replace(config, trainer=replace(t, num_envs=num_envs, rollout_len=rollout,
                                              total_steps=total, score_envs=score_envs),
                      algo=replace(algo, **algo_sizes))
    return Followed(resized, changes, why)


def _scored(config) -> bool:
    """Whether the run's env names a score measured on evaluation replicas."""
    from gpusim.envs import env_class
    try:
        return env_class(config.env_name).score is not None
    except Exception:  # noqa: BLE001 - an env that does not import here: nothing to follow
        return False
