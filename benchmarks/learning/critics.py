"""IPPO against MAPPO (a local against a centralized critic) on a cooperative env.

    python -m benchmarks.learning.critics   # simple_spread, 2 seeds
    python -m benchmarks.learning.critics --env simple_spread --seeds 0 1 2 --steps 500000

Each run is a fresh `python -m gpusim.train` process with the env's recipe and
`policy.critic=local` (IPPO: each agent's value net sees its own observation)
or `central` (MAPPO: it sees the replica's global state), the two interleaved
seed by seed. The table gives the mean episode return (the run's own metric,
over its last finished episodes) at a quarter, half and all of the budget,
the training throughput, and the wall time of the whole process.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine

from gpusim.training.trained.learning_curves import read_metrics

CRITICS = {"IPPO": "local", "MAPPO": "central"}
FRACTIONS = (0.25, 0.5, 1.0)


def train(env: str, critic: str, seed: int, steps: int, results: Path) -> dict:
    """One run: {'curve': [(env steps, mean return)], 'steps_per_s', 'wall_s'}."""
    out = results / f"{critic}_{seed}"
    argv = [sys.executable, "-m", "gpusim.train", "--env", env, "--backend", "cpu",
            "--quiet", "--seed", str(seed), "--total_steps", str(steps),
            "--results_dir", str(out), "--set", f"policy.critic={critic}",
            "--set", "trainer.target_return=null"]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(argv[3:])} exited {done.returncode}: "
                         f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    rows = read_metrics(next(out.glob("*/metrics.jsonl")).parent)
    curve = [(r["env_steps"], returns(r)) for r in rows if returns(r) is not None]
    rate = statistics.median(r["env_steps_per_s"] for r in rows[1:] or rows)
    return {"curve": curve, "steps_per_s": rate, "wall_s": wall}


def returns(row: dict) -> float | None:
    """The mean over the policies' episode returns in one metrics row (None before any)."""
    values = [v for k, v in row.items() if k.startswith("episode_return/") and v is not None]
    return sum(values) / len(values) if values else None


def at(curve: list, steps: float) -> float:
    """The return last logged at or before `steps` env steps (nan before any episode)."""
    logged = [ret for done, ret in curve if done <= steps]
    return logged[-1] if logged else float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="simple_spread")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=320_000)
    args = parser.parse_args(argv)
    print(machine())
    runs = {name: [] for name in CRITICS}
    with tempfile.TemporaryDirectory() as results:
        for seed in args.seeds:
            for name, critic in CRITICS.items():
                run = train(args.env, critic, seed, args.steps, Path(results))
                runs[name].append(run)
                print(f"{name} seed {seed}: return {at(run['curve'], args.steps):.2f}, "
                      f"{run['steps_per_s']:,.0f} steps/s, {run['wall_s']:.0f} s", flush=True)
    head = " | ".join(f"return at {f:.0%}" for f in FRACTIONS)
    print(f"\n{args.env}, {args.steps:,} env steps, seeds {args.seeds} (mean over seeds)")
    print(f"| critic | {head} | env steps/s | wall s |")
    print("|---|" + "---:|" * (len(FRACTIONS) + 2))
    for name, done in runs.items():
        cells = [statistics.mean(at(r["curve"], f * args.steps) for r in done)
                 for f in FRACTIONS]
        print(f"| {name} | " + " | ".join(f"{c:.2f}" for c in cells) +
              f" | {statistics.mean(r['steps_per_s'] for r in done):,.0f}"
              f" | {statistics.mean(r['wall_s'] for r in done):.0f} |")


if __name__ == "__main__":
    main()
