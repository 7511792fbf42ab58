"""Scaling benchmark: the default config vs `--auto_scale`, and 1 vs 2 processes.

    python -m benchmarks.release.scale                                 # tag_continuous on this machine
    python -m benchmarks.release.scale --memory_budget 2GiB --total_steps 200000
    python -m benchmarks.release.scale --backend numba --num_procs 2   # on a GPU machine

Every row is a real `python -m gpusim.train` run in a subprocess, on the same
machine in the same invocation. Throughput is env steps per second over all
processes, from metrics.jsonl, leaving out the first iteration (warm-up).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.common import machine


def train(args, extra, results) -> dict:
    argv = [sys.executable, "-m", "gpusim.train", "--env", args.env, "--backend", args.backend,
            "--total_steps", str(args.total_steps), "--quiet", "--results_dir", str(results),
            *extra]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{done.stderr[-2000:]}")
    run_dir = Path(re.search(r"run directory: (\S+)", done.stdout).group(1))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, last = (metrics[0], metrics[-1]) if len(metrics) > 1 else ({"env_steps": 0,
                                                                      "time_s": 0.0}, metrics[0])
    steps, seconds = last["env_steps"] - first["env_steps"], last["time_s"] - first["time_s"]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    report = config.get("auto_scale_report") or {}
    return {"num_envs": config["trainer"]["num_envs"],
            "rollout_len": config["trainer"]["rollout_len"],
            "processes": last.get("num_processes", 1),
            "iterations": len(metrics), "rate": steps / seconds if seconds else 0.0,
            "search_s": report.get("search_s"), "trials": sum(
                len(v) for v in report.get("trials", {}).values()) or None,
            "wall_s": wall, "stdout": done.stdout}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="tag_continuous")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--total_steps", type=int, default=100_000)
    parser.add_argument("--memory_budget", default=None,
                        help="for the auto-scale row (default: the backend's own default)")
    parser.add_argument("--num_procs", type=int, default=2, help="processes for the last row")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as results:
        budget = ["--memory_budget", args.memory_budget] if args.memory_budget else []
        for label, extra in (("default config, 1 process", []),
                             (f"default config, {args.num_procs} processes",
                              ["--num_gpus", str(args.num_procs)]),
                             (f"--auto_scale {' '.join(budget)}".strip(),
                              ["--auto_scale", *budget])):
            print(f"running: {label} ...", file=sys.stderr, flush=True)
            rows.append((label, train(args, extra, results)))

    print(f"\n{args.env} on {args.backend}; {machine()}; total_steps {args.total_steps:,}\n")
    print("| run | processes | num_envs / process | rollout_len | iterations | env steps/s "
          "(all processes) | search s (trials) | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for label, r in rows:
        search = f"{r['search_s']:.1f} ({r['trials']})" if r["search_s"] is not None else "-"
        print(f"| {label} | {r['processes']} | {r['num_envs']} | {r['rollout_len']} | "
              f"{r['iterations']} | {r['rate']:,.0f} | {search} | {r['wall_s']:.1f} |")


if __name__ == "__main__":
    main()
