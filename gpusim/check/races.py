"""check_env's `races` check: the reset and chosen steps of its rollout, replayed thread by
thread over recording arrays (gpusim.check.replay), against the race rules of
docs/custom_env.md ("Avoiding races"):

1. Between two barriers (within one phase), an entry one thread writes is read or
   written by no other thread.
2. In an agent phase, a thread writes only its own agent's entries of agent-scope
   arrays; per-replica (env-scope) entries may be shared out among the agents, one
   writer each, but only agent 0 may update one (read it, then write it).
3. A phase touches only its own replica's entries, and writes no global array.

`RaceWatch` rides along the rollout: it copies the arrays before the reset, and
before the first step, the first steps that end an episode by termination and by
truncation, the first in which an agent leaves play, and a few evenly spaced
steps; `races` replays them afterwards (the replica that showed the event first,
then more replicas while a budget of recorded accesses lasts).
"""
from __future__ import annotations

import torch

from gpusim import rng
from gpusim.check.compare import as_numpy
from gpusim.check.recorder import Recorder
from gpusim.check.replay import KernelFault, ReplayStopped, recorded_arrays, replay

SPACED = 4  # evenly spaced steps kept beside the events
BUDGET = 300_000  # recorded accesses past which later steps and more replicas are not replayed


class Failure(Exception):
    """The races check's FAIL message."""


class RaceWatch:
    """Copies of the env's arrays before the reset and before chosen steps of a rollout."""

    def __init__(self, env, steps: int):
        self.env = env
        self.fields = env.arrays.views._fields
        self.spaced = {round(k * steps / (SPACED + 1)) for k in range(1, SPACED + 1)} - {0}
        self.reset_input = None
        self.kept = []  # (label, step, replica, {field: numpy array})
        self._labels = set()
        self._buffer = None

    def _copy(self) -> dict:
        return {f: as_numpy(self.env.arrays.tensors[f]).copy() for f in self.fields}

    def before_reset(self, seed):
        """The arrays as the reset kernel will see them: re-seeded streams, flags cleared."""
        env = self.env
        arrays = self._copy()
        arrays["rng_state"][:] = as_numpy(rng.seed_streams(env.num_envs, env.num_agents, seed,
                                                           env.env_offset))
        for flag in ("terminated", "truncated", "reset_mask"):
            arrays[flag][:] = False
        self.reset_input = arrays

    def before_step(self, t):
        tensors = self.env.arrays.tensors
        if self._buffer is None:
            self._buffer = {f: tensors[f].clone() for f in self.fields}
        else:
            for f in self.fields:
                self._buffer[f].copy_(tensors[f])

    def after_step(self, t, out, active):
        """Keep the step's input if it showed a kind of event not seen before."""
        _, _, terminated, truncated, _ = out
        events = [("first termination", _first(terminated)),
                  ("first truncation", _first(truncated))]
        if active is not None:
            done = terminated | truncated
            now = torch.where(done[:, None], self.env.final_active(), self.env.agent_active())
            events.append(("first agent to leave play", _first((active & ~now).any(1))))
        events.append(("first step", 0 if t == 0 else None))
        if t in self.spaced:
            events.append((f"step {t}", 0))
        labels, replica = [], None
        for label, first in events:
            if first is not None and label not in self._labels:
                self._labels.add(label)
                labels.append(label)
                replica = first if replica is None else replica
        if not labels:
            return
        arrays = {f: as_numpy(b).copy() for f, b in self._buffer.items()}
        for name in ("actions", "continuous_actions"):  # written by the step itself
            if name in arrays:
                arrays[name][:] = as_numpy(self.env.arrays.tensors[name])
        self.kept.append((", ".join(labels), t, replica, arrays))


def _first(mask):
    found = mask.nonzero()
    return int(found[0, 0]) if len(found) else None


def races(env, watch: RaceWatch) -> str:
    """Replay what `watch` kept; the PASS message, or raise Failure with the first
    problem's line (and how many more were found).

    The reset and the first step kept always run, on the replica that showed its
    event; later steps, and more replicas, only while fewer than BUDGET accesses were
    recorded (a large env's replay takes about a microsecond per access)."""
    scopes = {name: spec.scope for name, spec in env.arrays.specs.items()}
    aliases = {"agent_active": env.agent_active_array} if env.agent_active_array else {}
    runs = []  # (spec, arrays, replica, what): the reset, the events, the spaced steps
    if watch.reset_input is not None:
        runs.append((env.reset_kernel_spec(), watch.reset_input, 0, "the reset"))
    for label, t, replica, arrays in sorted(watch.kept, key=lambda k: (k[0][0] == "s", k[1])):
        what = f"step {t}" + ("" if label.startswith("step ") else f" ({label})")
        runs.append((env.step_kernel_spec(), arrays, replica, what))
    # the auto-reset runs the reset phases, replayed already in the reset
    reset_phases = {p.fn for p in type(env).reset_phases} if watch.reset_input is not None \
        else set()
    lines, stopped, total, done, left = [], [], 0, [], []
    for k, (spec, arrays, replica, what) in enumerate(runs):
        if k > 1 and total >= BUDGET:
            left.append(what)
            continue
        done.append(what)
        recorder = Recorder()
        s = recorded_arrays(arrays, recorder, scopes, aliases)
        context = " in the reset" if what == "the reset" else f" at {what}"
        for e in [replica] + [e for e in range(env.num_envs) if e != replica]:
            if e != replica and total + recorder.accesses >= BUDGET:
                break
            try:
                lines += replay(spec, s, env._params, env.num_agents, [e], recorder, context,
                                skip=reset_phases)
            except KernelFault as fault:
                raise Failure(str(fault)) from None
            except ReplayStopped as exc:
                stopped.append(str(exc))
                break
        total += recorder.accesses
        if lines:
            more = f" ({len(lines) - 1} more found)" if len(lines) > 1 else ""
            raise Failure(lines[0] + more)
    events = [what.split(" (")[0] for what in left if "(" in what]
    spaced = len(left) - len(events)
    left_text = ", ".join(events + ([f"{spaced} spaced steps"] if spaced else []))
    note = f"; past {BUDGET:,} accesses, not replayed: {left_text}" if left else ""
    if stopped:
        note += f"; a replay stopped where Python differs from numba: {stopped[0]}"
    return (f"no race in {' and '.join(done)}, replayed thread by thread ({total:,} "
            f"accesses){note}")
