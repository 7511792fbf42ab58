"""check_env's `coverage` check: how the rollout's episodes ended, and which ends it never
reached.

A path the rollout never takes is a path no other check looked at: an env whose
reward divides by the agents left gives NaN only on the step that ends the
episode by termination, and random actions may never get there. The check
counts episodes that ended by termination and by truncation and, with per-agent
done, the agents that left play; it warns (one line, never a failure) about each
of these that never happened, and says how to reach it: a longer `steps=`, or
a `policy=` / `actions=` that drives the env there.
"""
from __future__ import annotations


class Warning_(Exception):
    """Raised with the coverage check's WARN message (the check still passes)."""


def coverage(rollout, ends=("termination", "truncation")) -> str:
    """`ends`: how the env says its episodes end (`Env.episode_ends`): a way it does not
    declare that happens fails; one it declares that never happened warns."""
    from gpusim.check.checks import Failure
    if rollout.error is not None or rollout.malformed:
        raise Failure("not run: the rollout stopped early (see the step check)")
    terminated = sum(r.terminated for r in rollout.steps)
    truncated = sum(r.truncated for r in rollout.steps)
    left = sum(r.agents_left for r in rollout.steps)
    ended = terminated + truncated
    facts = f"{_count(ended, 'episode')} ended: {terminated} by termination, {truncated} by " \
            "truncation"
    if rollout.per_agent_done:
        facts += f"; {_count(left, 'agent')} left play"
    within = f"in {len(rollout.steps)} steps of {rollout.actions}"
    happened = {"termination": terminated, "truncation": truncated}
    undeclared = [way for way, count in happened.items() if count and way not in ends]
    if undeclared:
        raise Failure(f"episodes ended by {undeclared[0]} {within} ({facts}), but the env "
                      f"declares they end by {' and '.join(ends)} only (Env.episode_ends)")
    gaps, paths = [], []
    missing = [way for way in ends if not happened[way]]
    if not ended:
        gaps.append("no episode ended")
        paths += missing
    elif missing:
        gaps.append(f"no episode ended by {missing[0]}")
        paths += missing
    if rollout.per_agent_done and not left:
        gaps.append("no agent left play")
        paths.append("per-agent done")
    if not gaps:
        return f"{within}, {facts}"
    untested = " and ".join(paths)
    raise Warning_(f"{' and '.join(gaps)} {within} ({facts}): the {untested} "
                   f"path{'s are' if len(paths) > 1 else ' is'} untested; if the env has "
                   f"{'them' if len(paths) > 1 else 'one'}, drive it there with policy= or "
                   "actions=, or pass a larger steps=")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
