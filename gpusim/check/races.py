"""check_env's `races` check: the reset and steps of its rollout replayed thread by thread
over recording arrays (gpusim.check.kernel_replay), against the race rules of
docs/env_phases.md ("Avoiding races"):

1. Between two barriers (within one phase), an entry one thread writes is read or
   written by no other thread.
2. In an agent phase, a thread writes only its own agent's entries of agent-scope
   arrays; per-replica (env-scope) entries may be shared out among the agents, one
   writer each, but an entry one agent updates (reads, then writes) no other agent
   updates in that phase, in any step replayed (a shared count).
3. A phase touches only its own replica's entries, and writes no global array.

`RaceWatch` rides along the rollout. It replays the reset (replica 0) and the
first step (the replica where its event happened) in any case; then, while fewer
than BUDGET accesses were recorded, every step with a kind of event not seen
before (a termination, a truncation, an agent leaving play) and the other steps,
each on as many replicas as the budget allows. A small env is replayed whole; in
a large one (tag_continuous: 110 agents, about 250,000 accesses a step) the
first step uses the budget up, and the check says which events it left out.
"""
from __future__ import annotations

import torch

from gpusim import rng
from gpusim.check.compare import as_numpy
from gpusim.check.kernel_replay import KernelFault, ReplayStopped, recorded_arrays, replay
from gpusim.check.recorder import Recorder

BUDGET = 300_000  # recorded accesses (about a microsecond each) past which steps are skipped


class Failure(Exception):
    """The races check's FAIL message."""


class RaceWatch:
    """Replays, during a rollout, the reset and the steps the budget allows."""

    def __init__(self, env, budget: int = BUDGET):
        self.env, self.budget = env, budget
        self.fields = env.arrays.views._fields
        self.scopes = {name: spec.scope for name, spec in env.arrays.specs.items()}
        self.aliases = {"agent_active": env.agent_active_array} if env.agent_active_array \
            else {}
        self.reset_phases = set()  # the auto-reset's, once the reset was replayed
        self.lines, self.stopped, self.fault = [], [], None
        self.nonfinite = None  # (step, line): where the first NaN or Inf replayed was written
        self.accesses = self.replica_steps = self.steps = 0
        self.events, self.missed = [], []  # (label, step) replayed, and left out
        self.updaters = {}  # shared by the replays' recorders (Recorder.updaters)
        self.found = set()  # (phase, array) of every problem found (Recorder.found)
        self._labels = set()
        self._buffer = None

    @property
    def done(self) -> bool:
        return bool(self.lines) or self.fault is not None

    # ---- the rollout's hooks ------------------------------------------------------------
    def before_reset(self, seed):
        """Replay the reset kernel on the arrays as it will see them: re-seeded streams,
        flags cleared."""
        env = self.env
        arrays = {f: as_numpy(env.arrays.tensors[f]).copy() for f in self.fields}
        arrays["rng_state"][:] = as_numpy(rng.seed_streams(env.num_envs, env.num_agents, seed,
                                                           env.env_offset))
        for flag in ("terminated", "truncated", "reset_mask"):
            arrays[flag][:] = False
        self._replay(env.reset_kernel_spec(), arrays, 0, " in the reset")
        self.reset_phases = {p.fn for p in type(env).reset_phases}

    def before_step(self, t):
        if self.done or (self.steps and self.accesses >= self.budget):
            return  # no step is replayed any more: nothing to keep
        tensors = self.env.arrays.tensors
        if self._buffer is None:
            self._buffer = {f: tensors[f].clone() for f in self.fields}
        else:
            for f in self.fields:
                self._buffer[f].copy_(tensors[f])

    def after_step(self, t, out, active):
        if self.done:
            return
        _, _, terminated, truncated, _ = out
        events = [("first termination", _first(terminated)),
                  ("first truncation", _first(truncated))]
        if active is not None:
            done = terminated | truncated
            now = torch.where(done[:, None], self.env.final_active(), self.env.agent_active())
            events.append(("first agent to leave play", _first((active & ~now).any(1))))
        new = [(label, e) for label, e in events if e is not None and label not in self._labels]
        self._labels.update(label for label, _ in new)
        if self.steps and self.accesses >= self.budget:
            self.missed += [(label, t) for label, _ in new]
            return
        arrays = {f: as_numpy(b) for f, b in self._buffer.items()}
        for name in ("actions", "continuous_actions"):  # written by the step itself
            if name in arrays:
                arrays[name][:] = as_numpy(self.env.arrays.tensors[name])
        labels = ", ".join(label for label, _ in new)
        self.events += [(label, t) for label, _ in new]
        self.steps += 1
        self._replay(self.env.step_kernel_spec(), arrays, new[0][1] if new else 0,
                     f" at step {t}" + (f" ({labels})" if labels else ""), t)

    # ---- replaying ---------------------------------------------------------------------
    def _replay(self, spec, arrays, first, context, step=None):
        env = self.env
        recorder = Recorder(updaters=self.updaters)
        s = recorded_arrays(arrays, recorder, self.scopes, self.aliases)
        for e in [first] + [e for e in range(env.num_envs) if e != first]:
            if e != first and self.accesses + recorder.accesses >= self.budget:
                break
            try:
                self.lines += replay(spec, s, env._params, env.num_agents, [e], recorder,
                                     context, skip=self.reset_phases)
            except KernelFault as fault:
                self.fault = fault
                break
            except ReplayStopped as exc:
                self.stopped.append(str(exc))
                break
            self.replica_steps += spec.name.endswith(".step")
        self.accesses += recorder.accesses
        self.found |= recorder.found
        if self.nonfinite is None and recorder.nonfinite_line is not None:
            self.nonfinite = (step, recorder.nonfinite_line)


def _first(mask):
    found = mask.nonzero()
    return int(found[0, 0]) if len(found) else None


def races(watch: RaceWatch) -> str:
    """The PASS message of what `watch` replayed, or raise Failure with the first problem
    (and how many more were found)."""
    if watch.fault is not None:
        raise Failure(str(watch.fault))
    if watch.lines:
        more = f" ({len(watch.lines) - 1} more found)" if len(watch.lines) > 1 else ""
        raise Failure(watch.lines[0] + more)
    events = "".join(f", {label} at step {t}" for label, t in watch.events)
    text = (f"no race in the reset and {watch.steps} step{'' if watch.steps == 1 else 's'} "
            f"replayed thread by thread ({watch.replica_steps} replica-step"
            f"{'' if watch.replica_steps == 1 else 's'}{events}; "
            f"{watch.accesses:,} accesses)")
    if watch.missed:
        text += f"; past {watch.budget:,} accesses, not replayed: " + ", ".join(
            f"{label} (step {t})" for label, t in watch.missed)
    if watch.stopped:
        text += f"; a replay stopped where Python differs from numba: {watch.stopped[0]}"
    return text
