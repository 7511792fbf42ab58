"""The run directory: resolved config, metrics.jsonl, TensorBoard events, checkpoints; and
what a run prints while it works: progress, and a note while kernels compile."""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import sys
import threading
import time
from pathlib import Path

from tqdm import tqdm

from gpusim.errors import GpusimError, writing

from . import checkpoint, metrics, snapshots
from .tensorboard import ScalarWriter, drop_steps_after


PROGRESS_EVERY_S = 30.0  # in a log (not a terminal): a progress line at least this often
COMPILE_NOTICE_AFTER_S = 2.0  # a build still running after this is a compile (loads from the
                              # compile cache take a fraction of it) and is announced


def new_run_dir(results_dir, env_name: str, seed: int) -> Path:
    """A fresh directory <results_dir>/<env>_<timestamp>_seed<seed>[_<n>]."""
    results = Path(results_dir)
    if results.exists() and not results.is_dir():
        raise GpusimError(f"--results_dir {results} is a file, not a directory")
    base = results / f"{env_name.replace(':', '_').replace('.', '_')}_" \
                      f"{time.strftime('%Y%m%d-%H%M%S')}_seed{seed}"
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}_{n}")
        except OSError as exc:
            raise GpusimError(f"cannot create a run directory in {results}: "
                              f"{exc.strerror}") from None


def lock_run_dir(run_dir: Path):
    """An exclusive lock on the run directory for this process's life (the open file).

    Two processes writing one run (two `--resume` of it, say) would interleave
    its metrics and checkpoints; the second is refused, naming the first.
    """
    path = Path(run_dir) / ".lock"
    with writing(path):  # a read-only run directory fails here, first
        handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise GpusimError(f"run directory {run_dir} is in use by pid {holder}") from None
    with writing(path, cleanup=handle.close):
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
    return handle


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunLogger:
    """Writes what a run produces. Only one process (rank 0) ever holds one."""

    def __init__(self, run_dir: Path, total_iterations: int, quiet: bool = False):
        self.run_dir = Path(run_dir)
        self._lock = lock_run_dir(self.run_dir)  # first: nothing is touched before it
        self.checkpoint_dir = self.run_dir / "checkpoints"
        checkpoint.remove_partial(self.checkpoint_dir)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.total = total_iterations
        self.quiet = quiet
        self.tensorboard = None
        self._tty = sys.stderr.isatty()
        self._bar = None
        self._rate = None
        self._first = None  # the first iteration this process logged (after a resume: later)
        self._last_log = self._last_line = None  # monotonic times of the last row, last line

    def resume_from(self, iteration: int, env_steps: int):
        """Drop what was logged after the checkpoint the run resumes from."""
        self._truncate_metrics(iteration)
        drop_steps_after(self.run_dir / "tensorboard", env_steps)
        snapshots.drop_after(self.run_dir, iteration)

    def _truncate_metrics(self, last_iteration: int):
        path = self.metrics_path
        if not path.exists() and not path.is_symlink():
            return
        lines = metrics.read_lines(path)
        kept = []
        for number, line in enumerate(lines, 1):
            row = metrics.record(line)
            if row is None:
                if number == len(lines):  # a line cut short by a kill: it is re-run anyway
                    break
                raise metrics.not_a_record(path, number)
            if row["iteration"] <= last_iteration:
                kept.append(line)
        temp = path.with_suffix(".tmp")
        with writing(path, cleanup=lambda: temp.unlink(missing_ok=True)):
            temp.write_text("".join(line + "\n" for line in kept))
            os.replace(temp, path)

    def log(self, row: dict, last: bool = False):
        if self._first is None:
            self._first = row["iteration"]
        clean = {k: _jsonable(v) for k, v in row.items()}
        with writing(self.metrics_path), open(self.metrics_path, "a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.tensorboard is None:  # after a resume has trimmed the old event files
            self.tensorboard = ScalarWriter(self.run_dir / "tensorboard")
        self.tensorboard.add_scalars(row["env_steps"], {
            k: v for k, v in clean.items() if k not in ("iteration", "env_steps")})
        self.progress(clean, last)

    def progress(self, m: dict, last: bool = False):
        """A tqdm bar on a terminal (elapsed, ETA, smoothed steps/s); about twenty plain lines
        in a log, and the line of the `last` iteration (a run stopped at its target)."""
        if self.quiet:
            return
        it = m["iteration"]
        rate = m["env_steps_per_s"]
        self._rate = rate if self._rate is None else 0.8 * self._rate + 0.2 * rate  # smoothed
        returns = " ".join(
            f"{key.split('/', 1)[1]}=" + ("n/a" if value is None else f"{value:.2f}")
            for key, value in m.items() if key.startswith("episode_return/"))
        status = f"{self._rate:,.0f} steps/s | return {returns}"
        scores = [(key.split("/")[1:], value) for key, value in m.items()
                  if key.startswith("score/")]  # the env's score, each side measured
        if scores:
            shown = ", ".join(f"{side}=" + ("n/a" if value is None else f"{value:.2f}")
                              for (_, side), value in scores)
            status += f" | {scores[0][0][0]} {shown} ({m['score_episodes']} episodes)"
        if self._tty:
            if self._bar is None:
                self._bar = tqdm(total=self.total, initial=it - 1, unit="it", file=sys.stderr,
                                 dynamic_ncols=True, smoothing=0.2)
            self._bar.set_postfix_str(status, refresh=False)
            self._bar.update(it - self._bar.n)
            return
        if not self._line_due(it) and not last:
            return
        elapsed = m["time_s"]
        done = it - (self._first if self._first is not None else it) + 1
        eta = (self.total - it) * elapsed / done
        print(f"{it}/{self.total} | {m['env_steps']:,} steps | elapsed {elapsed:,.0f} s | "
              f"ETA {eta:,.0f} s | {status}", file=sys.stderr, flush=True)

    def _line_due(self, it: int) -> bool:
        """Whether a log gets a line for iteration `it`: the first, every twentieth of the
        run, the last, and whenever waiting for the next would leave PROGRESS_EVERY_S
        without one."""
        now = time.monotonic()
        gap = now - self._last_log if self._last_log is not None else 0.0  # an iteration
        self._last_log = now
        due = (self._last_line is None or it % max(1, self.total // 20) == 0
               or it == self.total or now - self._last_line + gap >= PROGRESS_EVERY_S)
        if due:
            self._last_line = now
        return due

    def checkpoint(self, iteration: int, state: dict):
        checkpoint.save(self.checkpoint_dir, iteration, state)

    def snapshot(self, iteration: int, total: int, keep: int, env_steps: int, algorithm):
        """When due (trainer.keep_snapshots over `total` iterations): every policy's
        network into the run's snapshots (training.records.snapshots)."""
        if snapshots.due(iteration, total, keep):
            snapshots.save(self.run_dir, iteration, env_steps, algorithm.state_dict()["models"])

    def close(self):
        if self._bar is not None:
            self._bar.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        self._lock.close()


class CompileReport:
    """What a log shows while kernels compile, as the backends' compile reporter
    (gpusim.backends.set_compile_reporter): one line when a compile starts (a build still
    running after COMPILE_NOTICE_AFTER_S; loads from the compile cache print nothing), and
    one with the time it took: at `finish` for the run's set-up, at the end of a build
    for one that starts later."""

    def __init__(self, env_name: str, stream=None, notice_after_s: float = COMPILE_NOTICE_AFTER_S):
        self.env_name = env_name
        self.stream = stream if stream is not None else sys.stderr
        self.notice_after_s = notice_after_s
        self.set_up = False   # finish() was called: later compiles report their own end
        self.announced = False
        self.seconds = 0.0    # builds' time since the last end line
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, backend: str, kernel: str):
        start = time.perf_counter()
        timer = threading.Timer(self.notice_after_s, self._announce, (backend,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            timer.join()  # an announcement under way is printed before the end line
            with self._lock:
                self.seconds += time.perf_counter() - start
            if self.set_up:
                self._end()

    def _announce(self, backend: str):
        with self._lock:
            if self.announced:
                return
            self.announced = True
        print(f"compiling {self.env_name}'s kernels for the {backend} backend (first run "
              f"only: later runs load them from the compile cache)", file=self.stream,
              flush=True)

    def _end(self):
        with self._lock:
            announced, seconds = self.announced, self.seconds
            self.announced, self.seconds = False, 0.0
        if announced:
            print(f"compiled in {seconds:.1f} s", file=self.stream, flush=True)

    def finish(self):
        """The run's set-up is over: the end line of what compiled during it."""
        self.set_up = True
        self._end()
