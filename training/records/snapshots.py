"""A run's policies over training: `trainer.keep_snapshots` evenly spaced copies of every
policy's network, kept in RUN_DIR/snapshots/iter_<iteration>.pt.

Checkpoints keep only the last few states (training.records.checkpoint), so a plain run leaves
no record of what it played earlier. Snapshots hold networks only (no optimizer, no env
state): what `python -m gpusim.league RUN_DIR` needs to cross-play a run's past selves
and ask whether training cycles or forgets (training.judge.transitivity).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from gpusim.errors import GpusimError, writing

from .checkpoint import write_atomic

FOLDER = "snapshots"
PATTERN = re.compile(r"^iter_(\d{6})\.pt$")


def due(iteration: int, total: int, keep: int) -> bool:
    """Whether iteration `iteration` (1-based) of `total` is one of `keep` evenly spaced
    ones: ceil(k * total / keep) for k = 1..keep, so the last is the run's last."""
    if keep <= 0:
        return False
    return iteration * keep // total > (iteration - 1) * keep // total


def save(run_dir: Path, iteration: int, env_steps: int, models: dict) -> Path:
    """Every policy's network (its state dict, on the CPU) at `iteration`."""
    payload = {"iteration": iteration, "env_steps": env_steps,
               "models": {name: {key: value.detach().cpu() for key, value in state.items()}
                          for name, state in models.items()}}
    return write_atomic(Path(run_dir) / FOLDER / f"iter_{iteration:06d}.pt", payload)


def listed(run_dir: Path) -> list:
    """[(iteration, path)] of a run's snapshots, oldest first."""
    folder = Path(run_dir) / FOLDER
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := PATTERN.match(p.name))]
    return sorted(found)


def load(path: Path) -> dict:
    """One snapshot's {policy name: state dict}; a damaged file is one error line."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        models = state["models"]
        if not isinstance(models, dict):
            raise TypeError("models is not a dict")
    except Exception as exc:
        raise GpusimError(f"snapshot {path} cannot be loaded "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0][:100]})") from None
    return models


def drop_after(run_dir: Path, iteration: int):
    """A resumed run takes the snapshots after its checkpoint again."""
    for taken, path in listed(run_dir):
        if taken > iteration:
            with writing(path):
                path.unlink(missing_ok=True)
