"""Checkpoints: atomic writes, `weights_only=True` loads, the latest one found by name; each
records its run format, and one of an older format is read as today's (.migrations)."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import torch

from gpusim.errors import GpusimError, describe, writing

from . import migrations

PATTERN = re.compile(r"^checkpoint_(\d{6})\.pt$")
KEEP = 3


def save(directory: Path, iteration: int, payload: dict):
    """Write checkpoint_<iteration>.pt atomically (temp file, fsync, rename); keep the last few.

    A write that fails (a full disk) removes its temp file and raises one line naming
    the checkpoint: the previous checkpoints are untouched, so the run can resume.
    """
    final = write_atomic(directory / f"checkpoint_{iteration:06d}.pt", payload)
    for old in list_checkpoints(directory)[:-KEEP]:
        old.unlink(missing_ok=True)
    return final


def write_atomic(final: Path, payload: dict) -> Path:
    """torch.save to `final` through a temp file beside it (fsync, rename): a kill or a
    full disk leaves the previous file, or none, never half of one. The payload records
    its writer's run format and version."""
    payload = {**payload, **migrations.record()}
    temp = final.parent / f".{final.name}.tmp"
    with writing(final, cleanup=lambda: temp.unlink(missing_ok=True)):
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(temp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
    return final


def remove_partial(directory: Path):
    """Delete the temporary files of checkpoint writes a kill cut short."""
    if directory.is_dir():
        for temp in directory.glob(".checkpoint_*.pt.tmp"):
            with writing(temp):
                temp.unlink(missing_ok=True)


def list_checkpoints(directory: Path) -> list:
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if PATTERN.match(p.name)]
    return sorted(found, key=lambda p: int(PATTERN.match(p.name).group(1)))


def load_latest(directory: Path, warn=None) -> dict:
    """The newest checkpoint that loads, in today's format; a corrupt newer one is skipped
    with a warning."""
    warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
    checkpoints = list_checkpoints(directory)
    if not checkpoints:
        raise GpusimError(f"no checkpoint found in {directory}")
    errors = []
    for path in reversed(checkpoints):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # corrupt file: fall back to the previous one
            errors.append(f"{path.name}: {type(exc).__name__}")
            warn(f"warning: checkpoint {path} cannot be loaded ({describe(exc)[:120]}); "
                 "trying the one before it")
            continue
        if not isinstance(state, dict):
            raise GpusimError(f"{path} is not a gpusim checkpoint")
        return migrations.upgrade_checkpoint(state, path)[0]
    raise GpusimError(f"no loadable checkpoint in {directory} ({'; '.join(errors)})")


def to_cpu(value):
    """Tensors in nested dicts and lists moved to the host (checkpoints gather on rank 0)."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value
