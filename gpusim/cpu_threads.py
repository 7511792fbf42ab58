"""The CPU a process may use, and how its idle thread pools wait.

- `usable_cores`: the cores of the affinity mask, capped by a cgroup CPU
  quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`;
  the process's own group and its ancestors: containers and Slurm set these).
- `user_count`: a thread count the user set in the environment
  (`OMP_NUM_THREADS`, `NUMBA_NUM_THREADS`), or None.
- `set_wait_defaults`: idle OpenMP threads sleep instead of spinning
  (`OMP_WAIT_POLICY=PASSIVE`), unless the user chose. OpenMP runtimes read
  this once, when they load, so gpusim's package import calls it before
  torch is imported.

Imports nothing heavy: `gpusim/__init__` runs this first. Readers take a root
path, so tests can give them fake /proc and /sys trees.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

WAIT_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
# a user's own choice of how OpenMP threads wait; any of these leaves the defaults unset
WAIT_CHOICES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


# whether torch's OpenMP runtime had already read its settings when gpusim set them
torch_loaded_first = False


def early_defaults():
    """What gpusim's package import does first: the waiting defaults, noting whether torch
    (its OpenMP runtime) was imported before them and so keeps its own."""
    global torch_loaded_first
    torch_loaded = "torch" in sys.modules
    torch_loaded_first = bool(set_wait_defaults()) and torch_loaded


def set_wait_defaults(environ=os.environ) -> dict:
    """Set WAIT_DEFAULTS where the user set no waiting policy; what was set."""
    if any(environ.get(name) for name in WAIT_CHOICES):
        return {}
    for name, value in WAIT_DEFAULTS.items():
        environ[name] = value
    return dict(WAIT_DEFAULTS)


def user_count(name: str, environ=os.environ) -> int | None:
    """The thread count in environment variable `name` (OMP_NUM_THREADS may list one per
    nesting level: the first counts), or None when unset or not a positive integer."""
    raw = environ.get(name, "").split(",")[0].strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def usable_cores(root: str | Path = "/") -> int:
    """The cores this process may keep busy: its affinity, capped by a cgroup CPU quota
    (rounded down, at least 1: a thread beyond the quota only gets the group throttled)."""
    cores = affinity_cores()
    quota = cgroup_quota(root)
    if quota is not None:
        cores = min(cores, max(1, int(quota)))
    return cores


def cgroup_quota(root: str | Path = "/") -> float | None:
    """The tightest CPU quota, in cores, over this process's cgroups and their ancestors;
    None where there is none (or no cgroup file can be read)."""
    root = Path(root)
    quotas = [q for directory in _cgroup_cpu_dirs(root) for q in _quotas_up(directory)]
    return min(quotas, default=None)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _cgroup_cpu_dirs(root: Path):
    """The directories of this process's CPU cgroups (v2, and v1's `cpu` controller),
    each with the mount point it lies under: (directory, mount point)."""
    groups = {}  # controller ("" for v2) -> path inside the hierarchy
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                groups[controller] = parts[2]
    for line in (_read(root / "proc/self/mountinfo") or "").splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        fstype, _, options = line.split(" - ", 1)[1].split(" ")[:3]
        if fstype == "cgroup2":
            key = ""
        elif fstype == "cgroup" and "cpu" in options.split(","):
            key = "cpu"
        else:
            continue
        if key not in groups:
            continue
        mount_root, mount_point = fields[3], root / fields[4].lstrip("/")
        inside = Path(groups[key])
        try:  # the group's path is given from the hierarchy's root; the mount shows a part
            relative = inside.relative_to(mount_root)
        except ValueError:  # a container sees its own group as the mount itself
            relative = Path()
        yield mount_point / relative, mount_point


def _quotas_up(located):
    """The quota (cores) of a cgroup directory and of each ancestor up to its mount point."""
    directory, top = located
    while True:
        quota = _quota_in(directory)
        if quota is not None:
            yield quota
        if directory == top or top not in directory.parents:
            return
        directory = directory.parent


def _quota_in(directory: Path) -> float | None:
    v2 = _read(directory / "cpu.max")
    if v2 is not None:
        parts = v2.split()
        if len(parts) == 2 and parts[0] != "max":
            return _ratio(parts[0], parts[1])
        return None
    quota = _read(directory / "cpu.cfs_quota_us")
    period = _read(directory / "cpu.cfs_period_us")
    if quota is None or period is None:
        return None
    return _ratio(quota.strip(), period.strip())


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None  # v1 writes -1 for "no quota"
