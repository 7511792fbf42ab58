"""Wall time to a recipe's score, over a grid of sizes and seeds, and what --auto_scale picks.

    python benchmarks/time_to_score.py                      # the whole grid (about 90 min)
    python benchmarks/time_to_score.py --envs cartpole --seeds 2
    python benchmarks/time_to_score.py --report             # the table and plot of a saved run

Each run is `python -m gpusim.train` as a user types it, timed whole (start-up, compile
and warm-up included), stopped at the score (`trainer.target_score`) or at 3x the
recipe's env steps: a run that misses is reported as censored at its time, never
dropped. Sizes are multiples of the recipe's batch through `num_envs` (the recipe's
gradient steps per iteration, on larger minibatches). Beside the grid, the same runs
with `--auto_scale` (each objective), over the same seeds and under the same cap. Results go to a
JSON file run by run, so an interrupted grid resumes where it stopped.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

# name -> (train.py arguments, the recipe's num_envs and total_steps, target, seeds,
# gradient steps per iteration's share of a rollout: its num_minibatches)
ENVS = {
    "cartpole": (["--env", "cartpole"], 32, 499_712, 475.0, 5, 4),
    "simple_spread": (["--env", "simple_spread", "--set", "policy.critic=central"],
                      64, 1_000_000, -19.0, 5, 4),
    # 3 taggers and 8 runners: the runners' side moves (random taggers hold trained
    # runners 358 +- 21 steps, random ones 301 +- 23); the taggers' does not at this budget
    "tag_continuous_3+8": (["--env", "tag_continuous", "--set", "env.num_taggers=3",
                            "--set", "env.num_runners=8", "--set", "trainer.score_policy=runner",
                            "--set", "trainer.score_window=64"], 16, 399_872, 345.0, 3, 2),
}
SIZES = (0.25, 1, 4, 16)
CAP = 3  # a run stops at this many times the recipe's env steps
ONE_SEED_AT = {"tag_continuous_3+8": 16}  # sizes run with one seed only (their cost)
OBJECTIVES = ("time_to_score", "throughput")


ROLLOUT_LEN = {"cartpole": 64, "simple_spread": 25, "tag_continuous_3+8": 32}


def fitted_noise_scale(results: list, env: str) -> float | None:
    """B_noise as the grid's runs measure it: E(B) = E_min (1 + B / B_noise) fitted by
    least squares to the median env steps to the score at each size every seed reached
    (B: env steps per gradient step); None without two such sizes."""
    _, num_envs, _, _, _, minibatches = ENVS[env]
    points = []
    for size in SIZES:
        runs = [r for r in results if r["env"] == env and r["objective"] is None
                and r["size"] == size]
        if runs and all(r["reached"] for r in runs):
            batch = max(1, round(num_envs * size)) * ROLLOUT_LEN[env] / minibatches
            points.append((batch, statistics.median(r["env_steps"] for r in runs)))
    if len(points) < 2:
        return None
    mean_b = sum(b for b, _ in points) / len(points)
    mean_e = sum(e for _, e in points) / len(points)
    slope = sum((b - mean_b) * (e - mean_e) for b, e in points) / \
        sum((b - mean_b) ** 2 for b, _ in points)
    intercept = mean_e - slope * mean_b
    if slope <= 0:  # more data per step cost nothing measurable
        return 1e9
    return max(1.0, intercept / slope)


def run_once(env: str, size, seed: int, objective: str | None = None,
             noise_scale: float | None = None) -> dict:
    """One training run to the score, timed whole; what it reached and where it stopped."""
    args, num_envs, steps, target, _, _ = ENVS[env]
    with tempfile.TemporaryDirectory() as results:
        cmd = [sys.executable, "-m", "gpusim.train", *args, "--seed", str(seed),
               "--total_steps", str(CAP * steps), "--results_dir", results, "--quiet",
               "--set", f"trainer.target_score={target}",
               "--set", "trainer.final_eval_episodes=0"]
        if objective is None:
            cmd += ["--num_envs", str(max(1, round(num_envs * size)))]
        else:  # the search sizes the batch (under the same cap of steps)
            cmd += ["--auto_scale", "--set", f"scale.objective={objective}"]
            if objective == "time_to_score" and noise_scale is not None:
                cmd += ["--set", f"scale.noise_scale={noise_scale:.0f}"]
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
        run_dir = next(Path(results).iterdir())
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    picked = saved["trainer"]["num_envs"]
    search_s = (saved.get("auto_scale_report") or {}).get("search_s", 0.0)
    last = rows[-1]
    return {"env": env, "size": size, "seed": seed, "objective": objective,
            "noise_scale": noise_scale if objective == "time_to_score" else None,
            "num_envs": picked, "reached": "target reached" in out.stdout,
            "wall_s": round(wall, 2), "search_s": search_s, "train_s": last["time_s"], "env_steps": last["env_steps"],
            "score": next((v for k, v in last.items() if k.startswith("score/")), None)}


def summary(runs: list) -> dict:
    """Median wall time over seeds (a censored run counts at its time: the median is a
    lower bound, marked, where half or more missed), its range, and the hits."""
    times = sorted(r["wall_s"] for r in runs)
    hits = sum(r["reached"] for r in runs)
    return {"median_s": statistics.median(times), "min_s": times[0], "max_s": times[-1],
            "reached": hits, "runs": len(runs), "censored_median": 2 * hits <= len(runs)}


def table(results: list) -> str:
    lines = ["| env | size (x recipe batch) | num_envs | runs reaching the score | "
             "median wall s [range] | of it, the search |", "|---|---|---:|---:|---|---:|"]
    for env in ENVS:
        keys = [("grid", s) for s in SIZES] + [("auto", o) for o in OBJECTIVES]
        for kind, key in keys:
            runs = [r for r in results if r["env"] == env and
                    (r["objective"] is None and r["size"] == key if kind == "grid"
                     else r["objective"] == key)]
            if not runs:
                continue
            s = summary(runs)
            label = f"{key:g}" if kind == "grid" else f"--auto_scale ({key})"
            envs = sorted({r["num_envs"] for r in runs})
            mark = ">" if s["censored_median"] else ""
            search = statistics.median(r.get("search_s") or 0.0 for r in runs)
            lines.append(f"| {env} | {label} | {', '.join(map(str, envs))} | "
                         f"{s['reached']}/{s['runs']} | {mark}{s['median_s']:.1f} "
                         f"[{s['min_s']:.1f}, {s['max_s']:.1f}] | "
                         + (f"{search:.1f} |" if kind == "auto" else "- |"))
    return "\n".join(lines)


def plot(results: list, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(ENVS), figsize=(4.2 * len(ENVS), 3.4))
    for ax, env in zip(axes, ENVS):
        for size in SIZES:
            runs = [r for r in results if r["env"] == env and r["objective"] is None
                    and r["size"] == size]
            if not runs:
                continue
            s = summary(runs)
            ax.errorbar([size], [s["median_s"]], yerr=[[s["median_s"] - s["min_s"]],
                                                      [s["max_s"] - s["median_s"]]],
                        fmt="v" if s["censored_median"] else "o", color="C0", capsize=3)
            for r in runs:
                ax.scatter([size], [r["wall_s"]], s=8, color="C0" if r["reached"] else "C3",
                           alpha=0.5)
        for k, objective in enumerate(OBJECTIVES):
            runs = [r for r in results if r["env"] == env and r["objective"] == objective]
            if runs:
                s = summary(runs)
                ax.axhline(s["median_s"], color=f"C{k + 1}", ls="--", lw=1,
                           label=f"--auto_scale ({objective})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch, x the recipe's")
        ax.set_title(env)
        ax.set_ylabel("wall s to the score")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle("time to the score: median over seeds, range; red dots missed (censored)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", choices=tuple(ENVS), default=tuple(ENVS))
    parser.add_argument("--seeds", type=int, help="seeds per cell (default: each env's)")
    parser.add_argument("--sizes", nargs="+", type=float, default=SIZES)
    parser.add_argument("--objectives", nargs="*", choices=OBJECTIVES, default=OBJECTIVES)
    parser.add_argument("--out", default="time_to_score.json")
    parser.add_argument("--plot", default="docs/images/time_to_score.png")
    parser.add_argument("--report", action="store_true", help="only the table and plot")
    args = parser.parse_args()
    path = Path(args.out)
    results = json.loads(path.read_text()) if path.exists() else []
    if not args.report:
        print(machine(), flush=True)
        for env in args.envs:
            seeds = args.seeds or ENVS[env][4]
            cells = [(s, None) for s in args.sizes] + [(None, o) for o in args.objectives]
            for size, objective in cells:
                n = 1 if size is not None and size == ONE_SEED_AT.get(env) else seeds
                for seed in range(n):
                    done = any(r["env"] == env and r["seed"] == seed and r["size"] == size
                               and r["objective"] == objective for r in results)
                    if done:
                        continue
                    noise = fitted_noise_scale(results, env) if objective else None
                    result = run_once(env, size, seed, objective, noise)
                    print(json.dumps(result), flush=True)
                    results.append(result)
                    path.write_text(json.dumps(results, indent=1))
    print(table(results))
    for env in ENVS:
        noise = fitted_noise_scale(results, env)
        if noise is not None:
            print(f"{env}: B_noise fitted to the grid's env steps to the score: {noise:,.0f} "
                  "env steps per gradient step")
    plot(results, Path(args.plot))
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
