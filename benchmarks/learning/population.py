"""A population in one process against the same seeds as solo runs, one after the other.

    python -m benchmarks.learning.population   # cartpole x 8 and tag_continuous x 4
    python -m benchmarks.learning.population --only cartpole --members 8 --solos 8

Every run is a fresh `python -m gpusim.train` process, timed whole (start-up and
compiling included) and by its training time (its "done:" line):
- cartpole's recipe (it stops at its target return): the population of
  `--members` seeds in one process, and seeds 0 .. `--solos`-1 alone; each
  member's and each solo run's last mean return, and whether it reached the
  target;
- a fixed slice of the tag_continuous recipe (its first 50 iterations, no
  evaluation): 4 seeds in one process against one seed alone.
The ratio that counts is the population's wall time over one solo run's.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time

from benchmarks.common import machine

DONE = re.compile(r"done(?P<solved> \(target reached\))?: (?P<iterations>\d+) iterations, "
                  r"[\d,]+ env steps in (?P<train>[\d.]+) s")
RETURN = re.compile(r"[\w/]+ (-?[\d.]+|n/a)")
WORKLOADS = {
    "cartpole": ["--env", "cartpole", "--set", "trainer.final_eval_episodes=0"],
    "tag_continuous": ["--env", "tag_continuous", "--total_steps", "25600",
                       "--set", "trainer.final_eval_episodes=0"],
}


def run(args: list) -> dict:
    """One training process: wall and training seconds, iterations, solved, returns."""
    with tempfile.TemporaryDirectory(prefix="population-") as runs:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gpusim.train", *args, "--quiet",
                               "--results_dir", runs], capture_output=True, text=True)
        wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"gpusim.train {' '.join(args)} failed: {done.stderr[-400:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("done"))
    match = DONE.search(line)
    listed = line.split(" episodes: ", 1)[1].split("; run directory", 1)[0]
    returns = [float(v) for v in RETURN.findall(listed) if v != "n/a"]
    return {"wall_s": wall, "train_s": float(match["train"]),
            "iterations": int(match["iterations"]), "solved": bool(match["solved"]),
            "returns": returns}


def compare(name: str, members: int, solos: int) -> list:
    base = WORKLOADS[name]
    rows = [dict(run(base + ["--set", f"trainer.population={members}"]),
                 run=f"{members} seeds in one process")]
    for seed in range(solos):
        rows.append(dict(run(base + ["--seed", str(seed)]), run=f"seed {seed} alone"))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=tuple(WORKLOADS), help="one workload")
    parser.add_argument("--members", type=int, help="cartpole's population (default 8; tag: 4)")
    parser.add_argument("--solos", type=int, help="solo runs beside it (default: as many)")
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    for name in [args.only] if args.only else WORKLOADS:
        members = args.members or (8 if name == "cartpole" else 4)
        solos = args.solos if args.solos is not None else (members if name == "cartpole" else 1)
        rows = compare(name, members, solos)
        print(f"\n{name}: {members} seeds in one process, {solos} alone one after the other")
        print(f"{'run':<28} {'wall s':>8} {'train s':>8} {'iterations':>10}  solved  returns")
        for row in rows:
            returns = ", ".join(f"{r:.1f}" for r in row["returns"])
            print(f"{row['run']:<28} {row['wall_s']:8.1f} {row['train_s']:8.1f} "
                  f"{row['iterations']:10d}  {'yes' if row['solved'] else 'no':>6}  {returns}")
        alone = rows[1:]
        if alone:
            one = sum(r["wall_s"] for r in alone) / len(alone)
            print(f"population wall / one solo run's (mean of {len(alone)}): "
                  f"{rows[0]['wall_s'] / one:.2f}x; against all {len(alone)} one after the "
                  f"other: {rows[0]['wall_s'] / sum(r['wall_s'] for r in alone):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
