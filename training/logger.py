"""The run directory: resolved config, metrics.jsonl, TensorBoard events, checkpoints."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from . import checkpoint
from .tensorboard import ScalarWriter


def new_run_dir(results_dir, env_name: str, seed: int) -> Path:
    """A fresh directory <results_dir>/<env>_<timestamp>_seed<seed>[_<n>]."""
    base = Path(results_dir) / f"{env_name.replace(':', '_').replace('.', '_')}_" \
                               f"{time.strftime('%Y%m%d-%H%M%S')}_seed{seed}"
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}_{n}")


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunLogger:
    """Writes what a run produces. Only one process (rank 0) ever holds one."""

    def __init__(self, run_dir: Path, total_iterations: int, quiet: bool = False):
        self.run_dir = Path(run_dir)
        self.checkpoint_dir = self.run_dir / "checkpoints"
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.total = total_iterations
        self.quiet = quiet
        self.tensorboard = ScalarWriter(self.run_dir / "tensorboard")
        self._tty = sys.stderr.isatty()

    def truncate_metrics(self, last_iteration: int):
        """On resume: drop lines written after the checkpoint we resume from."""
        if not self.metrics_path.exists():
            return
        kept = [line for line in self.metrics_path.read_text().splitlines()
                if line.strip() and json.loads(line)["iteration"] <= last_iteration]
        temp = self.metrics_path.with_suffix(".tmp")
        temp.write_text("".join(line + "\n" for line in kept))
        os.replace(temp, self.metrics_path)

    def log(self, metrics: dict):
        clean = {k: _jsonable(v) for k, v in metrics.items()}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(clean) + "\n")
        self.tensorboard.add_scalars(metrics["env_steps"], {
            k: v for k, v in clean.items() if k not in ("iteration", "env_steps")})
        self.progress(clean)

    def progress(self, m: dict):
        if self.quiet:
            return
        it = m["iteration"]
        if not self._tty and it % max(1, self.total // 20) and it != self.total:
            return  # in logs, about twenty lines per run
        done = it / self.total
        bar = "#" * int(20 * done) + "." * (20 - int(20 * done))
        returns = " ".join(
            f"{key.split('/', 1)[1]}=" + ("n/a" if value is None else f"{value:.2f}")
            for key, value in m.items() if key.startswith("episode_return/"))
        line = (f"[{bar}] {it}/{self.total} | {m['env_steps']:,} steps | "
                f"{m['env_steps_per_s']:,.0f} steps/s | return {returns}")
        end = "\r" if self._tty and it != self.total else "\n"
        print(line, end=end, file=sys.stderr, flush=True)

    def checkpoint(self, iteration: int, state: dict):
        checkpoint.save(self.checkpoint_dir, iteration, state)

    def close(self):
        self.tensorboard.close()
