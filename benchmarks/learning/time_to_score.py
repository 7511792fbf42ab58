"""E(k): the env steps each recipe needs to its score at k x its replicas, and the wall time.

    python -m benchmarks.learning.time_to_score                      # the whole grid (hours on 2 cores)
    python -m benchmarks.learning.time_to_score --envs cartpole --seeds 2
    python -m benchmarks.learning.time_to_score --report             # the table and plot of a saved run
    python -m benchmarks.learning.time_to_score --report --write     # and the tables the search reads
    python -m benchmarks.learning.time_to_score --report --shipped   # plot every shipped table

Each run is `python -m gpusim.train ... --num_envs N` as a user types it (the replica
rule resizes the recipe: training.replicas), timed whole (start-up, compile and warm-up
included), stopped at the score or at the rule's budget (the recipe's iterations): a run
that misses is censored at its env steps, never dropped. Sizes are k x the recipe's
num_envs. Beside the grid, the same seeds with `--auto_scale` (each objective asked).
Results go to a JSON file run by run, so an interrupted grid resumes where it stopped.

E(k) is counted in env steps, so it holds on any device: `--write` keeps each recipe's
as `env_steps.yaml` beside it (training.env_steps), the median over seeds with its range
(for 5 seeds, the range is a 94% interval for the median; for 3, 75%) and the seeds that
reached the score; the auto-scale search divides it by each size's measured throughput.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.common import ROOT, machine

# name -> the env, the settings its table is measured with (none: the recipe as written),
# the recipe's num_envs, its ks and seeds
TAG_3_8 = {"env.num_taggers": 3, "env.num_runners": 8, "trainer.score_opponents": "random",
           "trainer.score_window": 64, "trainer.target_score": {"runner": 345}}
ENVS = {
    "cartpole": ("cartpole", {}, 32, (0.25, 1, 4, 16, 64), 5),
    "simple_spread": ("simple_spread", {"policy.critic": "central",
                                        "trainer.target_return": -19.0},
                      64, (0.25, 1, 4, 16, 64), 5),
    # 3 taggers and 8 runners, scored by the runners' side (random taggers hold trained
    # runners about 350 steps, random ones about 310)
    "tag_continuous_3+8": ("tag_continuous", TAG_3_8, 16, (0.25, 1, 4, 16, 64), 5),
    "tag_continuous": ("tag_continuous", {}, 16, (1, 4, 16, 64), 3),
    "pendulum": ("pendulum", {}, 64, (0.25, 1, 4, 16, 64), 5),
}
OBJECTIVES = ("time_to_score", "throughput")
QUIET = ["--set", "trainer.final_eval_episodes=0"]  # (no learning setting: training.env_steps)


def arguments(env: str) -> list:
    name, settings, *_ = ENVS[env]
    out = ["--env", name]
    for key, value in settings.items():
        out += ["--set", f"{key}={value}"]
    return out


def run_once(env: str, k, seed: int, objective: str | None = None) -> dict:
    """One training run as typed, timed whole; what it reached and where it stopped."""
    _, _, num_envs, _, _ = ENVS[env]
    with tempfile.TemporaryDirectory() as results:
        cmd = [sys.executable, "-m", "gpusim.train", *arguments(env), "--seed", str(seed),
               "--results_dir", results, "--quiet", *QUIET]
        if objective is None:
            cmd += ["--num_envs", str(max(1, round(num_envs * k)))]
        else:
            cmd += ["--auto_scale", "--set", f"scale.objective={objective}"]
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
        run_dir = next(Path(results).iterdir())
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    last = rows[-1]
    return {"env": env, "k": k, "seed": seed, "objective": objective,
            "num_envs": saved["trainer"]["num_envs"],
            "rollout_len": saved["trainer"]["rollout_len"],
            "reached": "target reached" in out.stdout, "wall_s": round(wall, 2),
            "search_s": (saved.get("auto_scale_report") or {}).get("search_s", 0.0),
            "train_s": last["time_s"], "env_steps": last["env_steps"]}


def cell(results: list, env: str, k=None, objective=None) -> list:
    return [r for r in results if r["env"] == env and r["objective"] == objective
            and (objective is not None or r["k"] == k)]


def summary(runs: list, key: str) -> dict:
    """Median over seeds (a censored run counts at its value: the median is a lower bound,
    marked, where half or more missed), its range, and the hits."""
    values = sorted(r[key] for r in runs)
    hits = sum(r["reached"] for r in runs)
    return {"median": statistics.median(values), "low": values[0], "high": values[-1],
            "reached": hits, "seeds": len(runs), "censored": 2 * hits <= len(runs)}


def table(results: list) -> str:
    lines = ["| recipe | k (x its replicas) | num_envs x rollout_len | seeds reaching the score "
             "| env steps: median [range] | E(k) / E(1) | wall s: median [range] | of it, the "
             "search |", "|---|---|---|---:|---|---:|---|---:|"]
    for env, (_, _, _, ks, _) in ENVS.items():
        base = cell(results, env, 1)
        e1 = summary(base, "env_steps")["median"] if base else None
        keys = [(k, None) for k in ks] + [(None, o) for o in OBJECTIVES]
        for k, objective in keys:
            runs = cell(results, env, k, objective)
            if not runs:
                continue
            e, w = summary(runs, "env_steps"), summary(runs, "wall_s")
            mark = ">" if e["censored"] else ""
            sizes = ", ".join(sorted({f"{r['num_envs']} x {r['rollout_len']}" for r in runs}))
            label = f"{k:g}" if objective is None else f"--auto_scale ({objective})"
            ratio = f"{mark}{e['median'] / e1:.2f}" if e1 else "-"
            search = statistics.median(r["search_s"] for r in runs)
            lines.append(
                f"| {env} | {label} | {sizes} | {e['reached']}/{e['seeds']} | "
                f"{mark}{e['median']:,.0f} [{e['low']:,.0f}, {e['high']:,.0f}] | {ratio} | "
                f"{w['median']:.1f} [{w['low']:.1f}, {w['high']:.1f}] | "
                + (f"{search:.1f} |" if objective else "- |"))
    return "\n".join(lines)


def measured_points(results: list, key: str) -> dict:
    """env -> [(k, summary of `key`)] over the ks measured, where k = 1 is among them."""
    points = {}
    for env, (_, _, _, ks, _) in ENVS.items():
        if cell(results, env, 1):
            points[env] = [(k, summary(cell(results, env, k), key)) for k in ks
                           if cell(results, env, k)]
    return points


def shipped_points() -> dict:
    """env -> [(k, summary)] from the env_steps.yaml tables beside the recipes."""
    points = {}
    for env, (name, settings, *_) in ENVS.items():
        path = ROOT / "envs" / name / "env_steps.yaml"
        entries = yaml.safe_load(path.read_text())["tables"] if path.exists() else []
        for entry in entries:
            if entry["name"] == env:
                points[env] = [(r["k"], {**r, "censored": 2 * r["reached"] <= r["seeds"]})
                               for r in entry["rows"]]
    return points


def plot(steps: dict, path: Path, wall: dict | None = None):
    """E(k) / E(1) per recipe (and, where given, the wall time) against k."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("E(k) / E(1): env steps to the score", steps, True)]
    if wall:
        panels.append(("wall s to the score (2-core CPU)", wall, False))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (title, points, relative) in zip(axes[0], panels):
        for n, env in enumerate(ENVS):
            if env not in points:
                continue
            xs = [k for k, _ in points[env]]
            s = [v for _, v in points[env]]
            scale = dict(points[env])[1]["median"] if relative else 1.0
            mid = [v["median"] / scale for v in s]
            err = [[(v["median"] - v["low"]) / scale for v in s],
                   [(v["high"] - v["median"]) / scale for v in s]]
            ax.errorbar(xs, mid, yerr=err, color=f"C{n}", capsize=3, marker="o", label=env)
            for x, v, m in zip(xs, s, mid):
                if v["censored"]:
                    ax.scatter([x], [m], marker="^", s=60, color=f"C{n}")
        if relative:
            ax.axhline(2, color="grey", lw=0.8, ls=":")
            ax.axhline(1.25, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("k: replicas, x the recipe's (the replica rule)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("median over seeds, range as bars; triangles: half or more censored",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_tables(results: list, commit: str):
    """Each recipe's E(k) as the tables the search reads, beside the recipe."""
    files = {}
    for env, (name, settings, _, ks, _) in ENVS.items():
        rows = []
        for k in ks:
            runs = cell(results, env, k)
            if runs:
                s = summary(runs, "env_steps")
                rows.append({"k": k, "median": int(s["median"]), "low": s["low"],
                             "high": s["high"], "reached": s["reached"], "seeds": s["seeds"]})
        if rows:
            entry = {"name": env, "settings": settings, "rows": rows}
            files.setdefault(name, []).append(entry)
    for name, entries in files.items():
        path = ROOT / "envs" / name / "env_steps.yaml"
        head = (f"# E(k): the env steps this env's recipe needs to its score at k x its "
                f"replicas, under the\n# replica rule (training/replicas.py); median over "
                f"seeds, its range, seeds reaching the\n# score within the rule's budget. "
                f"Measured by benchmarks/learning/time_to_score.py at commit {commit},\n# "
                f"{datetime.date.today()}, 2-core CPU (env steps hold on any device). "
                f"Read by training/env_steps.py.\n")
        path.write_text(head + yaml.safe_dump({"tables": entries}, sort_keys=False))
        print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", choices=tuple(ENVS), default=tuple(ENVS))
    parser.add_argument("--seeds", type=int, help="seeds per cell (default: each env's)")
    parser.add_argument("--ks", nargs="*", type=float,
                        help="default: each env's; none given: only the --objectives")
    parser.add_argument("--objectives", nargs="*", choices=OBJECTIVES, default=OBJECTIVES)
    parser.add_argument("--out", default="time_to_score.json")
    parser.add_argument("--plot", default="docs/images/time_to_score.png")
    parser.add_argument("--report", action="store_true", help="only the table and plot")
    parser.add_argument("--write", action="store_true", help="write the env_steps.yaml tables")
    parser.add_argument("--shipped", action="store_true",
                        help="plot the E(k) tables shipped beside the recipes instead")
    args = parser.parse_args()
    path = Path(args.out)
    results = json.loads(path.read_text()) if path.exists() else []
    if not args.report:
        print(machine(), flush=True)
        for env in args.envs:
            _, _, _, ks, seeds = ENVS[env]
            ks = ks if args.ks is None else args.ks
            cells = [(k, None) for k in ks] + [(None, o) for o in args.objectives]
            for k, objective in cells:
                for seed in range(args.seeds or seeds):
                    if any(r["seed"] == seed for r in cell(results, env, k, objective)):
                        continue
                    result = run_once(env, k, seed, objective)
                    print(json.dumps(result), flush=True)
                    results.append(result)
                    path.write_text(json.dumps(results, indent=1))
    print(table(results))
    if args.shipped:  # every recipe's shipped E(k), whatever this file holds
        plot(shipped_points(), Path(args.plot))
    else:
        plot(measured_points(results, "env_steps"), Path(args.plot),
             measured_points(results, "wall_s"))
    print(f"plot: {args.plot}")
    if args.write:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        write_tables(results, commit)


if __name__ == "__main__":
    main()
