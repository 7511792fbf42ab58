"""`python -m gpusim.upgrade RUN_DIR`: rewrite a run directory written by an older gpusim in
today's run format, keeping the original files in RUN_DIR/format<N>/.

Nothing needs it: every command reads an older run as today's as it loads it
(training.records.migrations). It makes the upgrade once, on disk: config.yaml and
every checkpoint (and those of its population members' run directories, where
`evaluate` wrote them), each checked to load before anything is written.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from gpusim.arguments import ArgumentParser
from gpusim.config import load_yaml
from gpusim.envs import env_class
from gpusim.errors import GpusimError, writing

from ..records import checkpoint, migrations
from ..records.logger import lock_run_dir
from ..run_config import check_complete, load_run_config


def upgrade(run_dir) -> list:
    """Upgrade `run_dir` (and its members' run directories) in place; lines saying what
    was done, one per directory."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise GpusimError(f"{run_dir} is not a run directory (no config.yaml)")
    members = sorted(p for p in (run_dir / "members").glob("*") if (p / "config.yaml").is_file())
    return [_upgrade_one(d) for d in [run_dir, *members]]


def _upgrade_one(run_dir: Path) -> str:
    lock = lock_run_dir(run_dir)  # a run in training is not rewritten under it
    try:
        path = run_dir / "config.yaml"
        saved, fmt, changes = migrations.upgrade_config(load_yaml(path), path)
        name = saved.get("env_name")
        if not name:
            raise GpusimError(f"{path} names no env (env_name)")
        # it loads as today's, or this is one error line and nothing was written
        config = load_run_config(name, env_class(name), path=path, data=saved)
        check_complete(saved, config, path)
        olds = []
        for ckpt in checkpoint.list_checkpoints(run_dir / "checkpoints"):
            state = _load(ckpt)
            state_fmt = migrations.checkpoint_format(state, ckpt)
            if state_fmt < migrations.FORMAT:
                olds.append((ckpt, state_fmt, migrations.upgrade_checkpoint(state, ckpt)[0]))
        if fmt == migrations.FORMAT and not olds:
            return f"{run_dir}: already in run format {migrations.FORMAT}, nothing to do"
        kept = min([fmt] + [f for _, f, _ in olds])  # the originals' folder: the oldest
        if fmt < migrations.FORMAT:
            migrations.keep_original(run_dir, kept, path)
            with writing(path):
                config.dump(path)
        for ckpt, _, state in olds:
            migrations.keep_original(run_dir, kept, ckpt)
            checkpoint.write_atomic(ckpt, state)
        return (f"{run_dir}: upgraded to run format {migrations.FORMAT} (config.yaml of "
                f"format {fmt}, {len(olds)} checkpoint(s) of an older one); "
                f"{'; '.join(changes) or 'no key changed'}; the originals are in "
                f"{run_dir / f'format{kept}'}")
    finally:
        lock.close()


def _load(path: Path) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise GpusimError(f"{path} cannot be loaded ({type(exc).__name__}): the run "
                          "directory was left as it was") from None
    if not isinstance(state, dict):
        raise GpusimError(f"{path} is not a gpusim checkpoint")
    return state


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m gpusim.upgrade", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="a run directory written by python -m gpusim.train")
    args = parser.parse_args(argv)
    try:
        lines = upgrade(args.run_dir)
    except GpusimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    for line in lines:
        print(line)
    return 0
