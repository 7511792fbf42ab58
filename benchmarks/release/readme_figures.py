"""The times the README states, measured as a new user meets them: the README's commands,
each a fresh process, wall time from start to exit.

    python -m benchmarks.release.readme_figures              # the training commands
    python -m benchmarks.release.readme_figures --tests      # and the test suite: default, then slow
    python -m benchmarks.release.readme_figures --only SAC   # the rows whose name holds SAC

- the main job (`python -m gpusim.train --env tag_continuous`) twice: first with an
  empty compile cache (a first run: every kernel compiles), then again (loads them);
- pendulum SAC likewise, cold then warm (its gradient step is torch.compiled by
  default on the CPU: the first run compiles it), and warm with the eager learner
  (`trainer.compile=off`) beside it;
- cartpole, acrobot and tag_gridworld with their recipes, warm cache;
- with `--tests`: `python -m pytest -q` (the README's test command) and
  `python -m pytest -q -m "slow and not learning"` (what CI runs after it), each
  timed whole.

Training runs write to a temporary results folder. The compile cache of the cold
run is a fresh temporary folder (GPUSIM_CACHE_DIR); the others use the user's.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

from benchmarks.common import ROOT, machine

COMMANDS = {  # name -> gpusim.train arguments (the README's commands)
    "tag_continuous (main job)": ["--env", "tag_continuous"],
    "cartpole": ["--env", "cartpole"],
    "acrobot": ["--env", "acrobot"],
    "tag_gridworld": ["--env", "tag_gridworld"],
    "pendulum SAC": ["--env", "pendulum", "--algorithm", "sac"],
    "pendulum SAC, compile off": ["--env", "pendulum", "--algorithm", "sac",
                                  "--set", "trainer.compile=off"],
}
COLD_TOO = ("tag_continuous (main job)", "pendulum SAC")  # also timed with an empty cache
DONE = re.compile(r"^done[^\n]*", re.MULTILINE)


def timed(argv: list[str], env: dict | None = None) -> tuple[float, str]:
    """(wall seconds, the last line worth showing) of one process; a failure stops the run."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        raise SystemExit(f"error: {' '.join(argv[1:])} exited {done.returncode}: {tail}")
    found = DONE.search(done.stdout + done.stderr)
    summary = found.group(0) if found else (done.stdout.strip().splitlines() or [""])[-1]
    return wall, summary


def train(args: list[str], results: str, cache: str | None = None) -> tuple[float, str]:
    env = dict(os.environ)
    if cache is not None:
        env["GPUSIM_CACHE_DIR"] = cache
    return timed([sys.executable, "-m", "gpusim.train", *args, "--quiet",
                  "--results_dir", results], env)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tests", action="store_true", help="time the test suite too")
    parser.add_argument("--only", default="", help="only the commands whose name holds this")
    args = parser.parse_args(argv)
    print(machine())
    print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    rows = []
    with tempfile.TemporaryDirectory() as results, tempfile.TemporaryDirectory() as cold:
        for name, command in COMMANDS.items():
            if args.only not in name:
                continue
            if name in COLD_TOO:
                rows.append((f"{name}, first run (empty compile cache)",
                             *train(command, results, cache=cold)))
                rows.append((f"{name}, later runs", *train(command, results)))
            else:
                rows.append((name, *train(command, results)))
            print(f"{rows[-1][0]}: {rows[-1][1]:.0f} s", flush=True)
    if args.tests:
        for name, extra in (("test suite, default (`python -m pytest -q`)", []),
                            ("test suite, slow tests (`-m \"slow and not learning\"`)",
                             ["-m", "slow and not learning"])):
            rows.append((name, *timed([sys.executable, "-m", "pytest", "-q", *extra])))
            print(f"{rows[-1][0]}: {rows[-1][1]:.0f} s", flush=True)
    print(f"load average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print("\n| command | wall time | its summary line |")
    print("|---|---:|---|")
    for name, wall, summary in rows:
        print(f"| {name} | {wall:,.0f} s | {summary.strip()} |")


if __name__ == "__main__":
    main()
