"""Where a gpusim training iteration's launches and device time go, per phase.

`profile_iteration(trainer)` runs one rollout and one update under
`torch.profiler` (CUDA activity where the env runs on a GPU, else the CPU's),
each phase inside `record_function` and ending with a device synchronisation,
so everything a phase launched finishes inside its own range. Per phase:

- host launch calls: the runtime and driver calls that start device work
  (`cudaLaunchKernel`, `cuLaunchKernel`, `cudaGraphLaunch`, ...); a CUDA
  graph replay is one such call however many kernels it holds;
- device kernels: the kernels that ran on the GPU, each attributed to the
  phase of the host call that launched it (by correlation id), else to the
  phase its own start falls in;
- on the CPU, where nothing is launched, the torch operators called at the
  phase's top level stand in for launches, and the phase's time outside any
  operator (the env's numba kernels, Python) is one row of its own.

The rollout's counts are per env step (divided by `rollout_len`), the
update's per update.
"""
from __future__ import annotations

import collections
import inspect

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

PHASES = ("rollout", "update")
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cuGraphLaunch",
                "cudaLaunchCooperativeKernel", "cuLaunchCooperativeKernel")
NOT_KERNELS = ("gpu_memcpy", "gpu_memset", "gpu_user_annotation")  # device activity types
OUTSIDE_OPS = "(outside torch operators: env kernels, Python)"


def profile_iteration(trainer, top: int = 5) -> list:
    """One profiled rollout and update of `trainer` (warmed up first): a dict per phase."""
    cuda = trainer.env.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    lr = trainer.config.trainer.lr
    runs = {"rollout": lambda: trainer.algorithm.collect(trainer.env_steps),
            "update": lambda: trainer.algorithm.update(lr)}
    # one profiling cycle, so nothing to clear; without acc_events torch (2.11) warns that
    # it clears events when the process prepared a profile before
    keep = {"acc_events": True} if "acc_events" in inspect.signature(profile).parameters else {}
    trainer.env.backend.synchronize()
    with profile(activities=activities, **keep) as prof:
        for phase in PHASES:
            trainer.context.use_threads(phase)  # as Trainer.iterate does
            with record_function(phase):
                runs[phase]()
                trainer.env.backend.synchronize()
    per = {"rollout": trainer.config.trainer.rollout_len, "update": 1}
    return summarise(list(prof.events()), cuda, per, top)


def summarise(events: list, cuda: bool, per: dict, top: int) -> list:
    """Per phase: launches, kernels and the top kernels (operators on the CPU)."""
    ranges = {e.name: (e.time_range.start, e.time_range.end) for e in events
              if e.name in PHASES and e.device_type == DeviceType.CPU and e.is_user_annotation}

    def phase_at(t: float):
        return next((p for p, (start, end) in ranges.items() if start <= t <= end), None)
    rows = []
    for phase in PHASES:
        if phase not in ranges:
            continue
        steps = per[phase]
        row = {"phase": phase, "per": "env step" if phase == "rollout" else "update",
               "steps": steps, "launches_are": "CUDA launch calls" if cuda
               else "torch operator calls"}
        if cuda:
            launches, kernels = _cuda_counts(events, phase_at)
            row["host_launches"] = len(launches.get(phase, []))
            found = kernels.get(phase, [])
            row["device_kernels"] = len(found)
            row["device_ms"] = round(sum(_us(k) for k in found) / 1000, 3)
            row["top"] = _top([(k.name, _us(k)) for k in found], top)
        else:
            ops, outside_us = _cpu_ops(events, phase)
            row["host_launches"] = len(ops)  # operator calls: the CPU's launches
            row["device_kernels"] = None
            timed = [(e.name, e.self_cpu_time_total) for e in _descendants(events, phase)]
            timed.append((OUTSIDE_OPS, outside_us))
            row["device_ms"] = round(sum(t for _, t in timed) / 1000, 3)
            row["top"] = _top(timed, top)
        row["host_launches_per"] = round(row["host_launches"] / steps, 2)
        row["device_kernels_per"] = None if row["device_kernels"] is None else \
            round(row["device_kernels"] / steps, 2)
        rows.append(row)
    return rows


def _us(event) -> float:
    return event.time_range.end - event.time_range.start


def _cuda_counts(events, phase_at):
    """({phase: host launch calls}, {phase: device kernels})."""
    launches, kernels = collections.defaultdict(list), collections.defaultdict(list)
    launched_at = {}  # correlation id -> host time of the call that launched it
    for e in events:
        if e.device_type == DeviceType.CPU and e.name.startswith(LAUNCH_CALLS):
            launched_at[e.id] = e.time_range.start
            phase = phase_at(e.time_range.start)
            if phase is not None:
                launches[phase].append(e)
    for e in events:
        if e.device_type != DeviceType.CUDA or e.is_user_annotation \
                or getattr(e, "activity_type", None) in NOT_KERNELS \
                or e.name.startswith(("Memcpy", "Memset")):
            continue
        phase = phase_at(launched_at.get(e.id, e.time_range.start))
        if phase is not None:
            kernels[phase].append(e)
    return launches, kernels


def _descendants(events, phase):
    """The CPU operators inside `phase`'s own range (nested ones too)."""
    root = _phase_event(events, phase)
    found, stack = [], list(root.cpu_children)
    while stack:
        e = stack.pop()
        if not e.is_user_annotation:
            found.append(e)
        stack.extend(e.cpu_children)
    return found


def _cpu_ops(events, phase):
    """(the operators called at the phase's top level, the phase's time outside operators,
    in us). Annotations inside the phase (a compiled region, say) are looked through."""
    root = _phase_event(events, phase)
    ops, stack = [], list(root.cpu_children)
    while stack:
        e = stack.pop()
        if e.is_user_annotation:
            stack.extend(e.cpu_children)
        else:
            ops.append(e)
    return ops, root.self_cpu_time_total


def _phase_event(events, phase):
    return next(e for e in events if e.name == phase and e.is_user_annotation
                and e.device_type == DeviceType.CPU)


def _top(timed: list, top: int) -> list:
    """The `top` names by total time: name, calls, ms and share of the phase's total."""
    totals, calls = collections.defaultdict(float), collections.Counter()
    for name, us in timed:
        totals[name] += us
        calls[name] += 1
    whole = sum(totals.values()) or 1.0
    best = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return [{"name": name, "calls": calls[name], "ms": round(us / 1000, 3),
             "share": round(us / whole, 3)} for name, us in best]


def print_profile(label: str, rows: list, cuda: bool):
    """The table: a line per phase, then its top kernels (operators on the CPU)."""
    what = ("host launch calls", "GPU kernels", "GPU ms", "top kernels by GPU time") if cuda \
        else ("operator calls", "", "CPU ms", "top operators by self CPU time")
    print(f"profile of {label}:")
    print(f"  {'phase':<8} {'per':<9} {what[0]:>18} {what[1]:>12} {what[2]:>10}")
    for row in rows:
        kernels = "" if row["device_kernels_per"] is None else f"{row['device_kernels_per']:,.2f}"
        print(f"  {row['phase']:<8} {row['per']:<9} {row['host_launches_per']:>18,.2f} "
              f"{kernels:>12} {row['device_ms']:>10,.3f}")
    if cuda and not any(row["device_kernels"] for row in rows):
        print("  the profiler recorded no GPU kernel (is CUPTI, in torch's CUDA build, "
              "usable here?)")
    for row in rows:
        print(f"  {row['phase']} {what[3]}:")
        for item in row["top"]:
            name = item["name"] if len(item["name"]) <= 70 else item["name"][:67] + "..."
            print(f"    {item['share']:6.1%} {item['ms']:>10,.3f} ms {item['calls']:>7,}x  {name}")
    print(flush=True)
