"""check_env's `static_races` check: every agent phase read, not run, for the writes that
several agents can reach at once (docs/env_phases.md, "Avoiding races").

The recorded `races` check sees only the paths its rollout takes; this one reads each
agent phase's source (its `py_func`, and the jit helpers it calls, their parameters
mapped to the caller's arguments) and reports, as "may race":

- a write to an array entry whose index does not depend on the agent (`s.left[env] -= 1`),
  unless a condition selects one agent (`if agent == 0:`, `if agent == p.leader and ...`,
  or `if agent != k: return` before it), it is atomic (`cuda.atomic.*`), or the phase
  declares the array safe: `agent_phase(fn, race_free=("left",))`;
- a read, at an index that does not depend on the agent, of an array the same phase
  writes at an agent's own index (`s.x[env, j]` while each agent writes `s.x[env, agent]`).

"Depends on the agent": the agent parameter, and any local assigned (or looped over a
range) from an expression naming it, flow-insensitively, so a doubt counts as
dependent: fewer reports, never a false one on that account. Conditions made only of
the env's parameters (`p.bug == RACE`) and constants are evaluated, so a branch the
config rules out is not read.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpusim.check.static_walk import Scan, Value, parsed


class Failure(Exception):
    """The static_races check's FAIL message."""


@dataclass(frozen=True)
class Finding:
    phase: object  # the phase's function
    kernel: str
    array: str
    where: str  # file.py:line
    text: str  # the one-line report


def find(specs, params=None, num_agents=None, known=()) -> tuple:
    """(findings, phases read, phases without source) for the agent phases of kernel
    specs `specs`, each phase once. `params`: the env's parameter namedtuple (None:
    conditions on it are not evaluated); `known`: (phase function, array) pairs the
    recorded races check already reported, left out."""
    found, seen, unread = [], [], []
    if num_agents == 1:  # one thread per replica: nothing to race with
        return found, seen, unread
    for spec in specs:
        for section in spec.sections:
            for phase in section.phases:
                if phase.per_env or phase.fn in seen or phase.fn in unread:
                    continue
                if parsed(phase.fn) is None:
                    unread.append(phase.fn)
                    continue
                seen.append(phase.fn)
                skip = set(getattr(phase, "race_free", ())) | {a for f, a in known
                                                              if f is phase.fn}
                found += [f for f in _phase_findings(phase.fn, spec.name, params)
                          if f.array not in skip]
    return found, seen, unread


def _phase_findings(fn, kernel, params) -> list:
    node, _ = parsed(fn)
    args = [a.arg for a in node.args.args]
    if len(args) < 4:
        return []
    scan = Scan(params)
    scan.function(fn, {args[0]: Value(), args[1]: Value(dep=True, agent=True),
                       args[2]: Value(state=True), args[3]: Value(params=True)}, False, 0)
    found, reported = [], set()
    phase = f"agent phase '{_name(fn)}' of kernel '{kernel}'"
    optout = f"agent_phase({_name(fn)}, race_free=(\"{{}}\",))"
    for w in scan.writes:  # an agent-independent entry, no guard, no atomic
        if not (w.dep or w.guarded or w.atomic) and w.array not in reported:
            reported.add(w.array)
            verb = "updates (reads, then writes)" if w.update else "writes"
            found.append(Finding(fn, kernel, w.array, w.where, (
                f"{phase} {verb} {w.array}[{w.index}] ({w.where}) from every agent that gets "
                f"there: the index [{w.index}] does not depend on the agent, no single-agent "
                "guard (if agent == ...), not atomic: may race on a GPU (no run showed it); "
                "do it in an env phase or from one agent, or, if it is safe, declare it: "
                + optout.format(w.array))))
    own = {w.array: w for w in scan.writes if w.dep and not w.atomic}
    for r in scan.reads:
        if r.array in own and not r.dep and r.array not in reported:
            reported.add(r.array)
            w = own[r.array]
            found.append(Finding(fn, kernel, r.array, r.where, (
                f"{phase} reads {r.array}[{r.index}] ({r.where}), an index that does not "
                f"depend on the agent, while each agent writes {w.array}[{w.index}] "
                f"({w.where}): may race on a GPU (no run showed it); read it in a later "
                "phase, or, if it is safe, declare it: " + optout.format(r.array))))
    return found


def _name(fn):
    return getattr(getattr(fn, "py_func", fn), "__name__", repr(fn))


def env_findings(env, known=()) -> tuple:
    """`find` over env's reset, step and observe kernels."""
    specs = [env.reset_kernel_spec(), env.step_kernel_spec(), env.observe_kernel_spec()]
    return find(specs, getattr(env, "_params", None), env.num_agents, known)


def static_races(env, watch=None) -> str:
    """check_env's check: the PASS message, or raise Failure with the first finding (and
    how many more). `watch`: the races check's RaceWatch, whose findings are not repeated."""
    known = watch.found if watch is not None else set()
    found, seen, unread = env_findings(env, known)
    if found:
        more = f" ({len(found) - 1} more found)" if len(found) > 1 else ""
        raise Failure(found[0].text + more)
    if env.num_agents == 1:
        return "one agent per replica: no two threads to race"
    text = (f"no entry several agents may write at once, nor read while another writes "
            f"it, in {len(seen)} agent phase{'' if len(seen) == 1 else 's'} read (their "
            "source and helpers, not run)")
    if any(f in seen for f, _ in known):
        text += "; what the races check reported is not repeated"
    if unread:
        text += "; no source to read for " + ", ".join(f"'{_name(f)}'" for f in unread)
    return text
