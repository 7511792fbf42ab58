"""tag_continuous's learning curves against its scripted panel, one change at a time.

    python -m benchmarks.learning.tag_curves --game 3+8 --label recipe --seeds 3
    python -m benchmarks.learning.tag_curves --game 3+8 --label own_state --seeds 3 \
        --set env.observe_own_state=true
    python -m benchmarks.learning.tag_curves --report   # the table and plot of saved runs

Each run trains the recipe (with `--set` changes) in this process for `--steps` env steps,
its score's target off, and every `--every` env steps plays its current policies (sampled,
as they train) on evaluation replicas of their own against the fixed panel, `--episodes`
each (steps a runner survives, mean and 95% interval):
- trained taggers against the scripted fleer (lower: the taggers hold it),
- the scripted chaser against trained runners (higher: the runners flee),
- trained taggers against random runners, random taggers against trained runners,
- trained against trained,
beside the panel's own yardsticks, measured once per game: the chaser against the fleer,
random against random. Rows go to --out as JSON lines, run by run, so an interrupted set
resumes; `--report` prints, per label, each curve's value at the last point over seeds
(mean and 95% t-interval) and plots the curves.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from benchmarks.common import machine

GAMES = {"3+8": ["env.num_taggers=3", "env.num_runners=8"], "10+100": []}
PAIRINGS = {  # name -> (what the taggers play, what the runners play)
    "taggers_vs_fleer": ("trained", "fleer"),
    "chaser_vs_runners": ("chaser", "trained"),
    "taggers_vs_random": ("trained", "random"),
    "random_vs_runners": ("random", "trained"),
    "trained_vs_trained": ("trained", "trained"),
}
YARDSTICKS = {"chaser_vs_fleer": ("chaser", "fleer"), "random_vs_random": ("random", "random")}
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36}


def config_for(game: str, sets: list, seed: int, steps: int):
    from gpusim.envs import env_class
    from gpusim.training.run_config import load_run_config
    cls = env_class("tag_continuous")
    config = load_run_config("tag_continuous", cls, sets=GAMES[game] + list(sets) + [
        f"trainer.seed={seed}", f"trainer.total_steps={steps}", "trainer.target_score=null",
        "trainer.final_eval_episodes=0", "trainer.checkpoint_every=1000000"])
    return cls, config


def panel(cls, config, models: dict, episodes: int, which: dict, seed: int) -> dict:
    """Steps survived per pairing: (mean, half-width of its 95% interval)."""
    from gpusim.envs.tag_continuous.scripted import Chaser, Fleer
    from gpusim.training.trained.evaluation import mean_ci, play
    env = cls(num_envs=episodes, backend="cpu", seed=10_000 + seed, config=config.env)
    out = {}
    for name, (taggers, runners) in which.items():
        acting = {}
        for side, what in (("tagger", taggers), ("runner", runners)):
            if what == "trained":
                acting[side] = models[side]
            elif what in ("chaser", "fleer"):
                acting[side] = (Chaser if what == "chaser" else Fleer)(env, side)
        survived = play(env, acting, episodes)["runner_steps_survived"]
        out[name] = tuple(round(v, 2) for v in mean_ci(survived))
    return out


def train_with_curves(game, label, sets, seed, steps, every, episodes, out: Path):
    from gpusim.training.loop import Trainer
    cls, config = config_for(game, sets, seed, steps)
    trainer = Trainer(config, cls)
    start, next_eval = time.perf_counter(), 0
    while True:
        if trainer.env_steps >= next_eval or trainer.iteration == trainer.num_iterations:
            row = {"game": game, "label": label, "sets": sets, "seed": seed,
                   "env_steps": trainer.env_steps, "train_s": round(trainer.elapsed_s, 1),
                   **panel(cls, config, trainer.algorithm.models(), episodes, PAIRINGS, seed)}
            print(json.dumps(row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            next_eval += every
        if trainer.iteration == trainer.num_iterations:
            break
        trainer._train_one(False)
    return time.perf_counter() - start


def yardsticks(game: str, episodes: int, out: Path):
    cls, config = config_for(game, [], 0, 1)
    row = {"game": game, "label": "yardsticks", **panel(cls, config, {}, episodes,
                                                       YARDSTICKS, 0)}
    print(json.dumps(row), flush=True)
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")


def interval(values: list) -> str:
    mean = statistics.mean(values)
    if len(values) < 2:
        return f"{mean:.1f}"
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:.1f} +- {half:.1f}"


def report(rows: list, plot_path: Path | None):
    for row in rows:
        if row["label"] == "yardsticks":
            print(f"{row['game']}: chaser vs fleer {row['chaser_vs_fleer'][0]:.1f} +- "
                  f"{row['chaser_vs_fleer'][1]:.1f}, random vs random "
                  f"{row['random_vs_random'][0]:.1f} +- {row['random_vs_random'][1]:.1f}")
    runs = [r for r in rows if r["label"] != "yardsticks"]
    keys = sorted({(r["game"], r["label"]) for r in runs})
    print("| game | change | seeds | env steps | " + " | ".join(PAIRINGS) + " |")
    print("|---|---|---:|---:|" + "---|" * len(PAIRINGS))
    for game, label in keys:
        mine = [r for r in runs if (r["game"], r["label"]) == (game, label)]
        last = {}
        for r in mine:  # each seed's last point
            if r["seed"] not in last or r["env_steps"] > last[r["seed"]]["env_steps"]:
                last[r["seed"]] = r
        steps = min(r["env_steps"] for r in last.values())
        cells = [interval([r[p][0] for r in last.values()]) for p in PAIRINGS]
        print(f"| {game} | {label} | {len(last)} | {steps:,} | " + " | ".join(cells) + " |")
    if plot_path is not None and runs:
        plot(runs, keys, plot_path)


def plot(runs, keys, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    games = sorted({g for g, _ in keys})
    fig, axes = plt.subplots(len(games), 2, figsize=(10, 3.4 * len(games)), squeeze=False)
    for row, game in zip(axes, games):
        for ax, pairing in zip(row, ("taggers_vs_fleer", "chaser_vs_runners")):
            for k, (g, label) in enumerate(k for k in keys if k[0] == game):
                mine = [r for r in runs if (r["game"], r["label"]) == (g, label)]
                steps = sorted({r["env_steps"] for r in mine})
                means = [statistics.mean(r[pairing][0] for r in mine if r["env_steps"] == s)
                         for s in steps]
                ax.plot(steps, means, color=f"C{k}", label=label)
            ax.set_title(f"{game}: {pairing.replace('_', ' ')}", fontsize=9)
            ax.set_xlabel("env steps")
            ax.set_ylabel("steps a runner survives")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--game", choices=tuple(GAMES), default="3+8")
    parser.add_argument("--label", default="recipe")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1_200_000)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--out", default="tag_curves.jsonl")
    parser.add_argument("--plot", default="tag_curves.png")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if not args.report:
        print(machine(), flush=True)
        if not any(r["label"] == "yardsticks" and r["game"] == args.game for r in rows):
            yardsticks(args.game, args.episodes, out)
        for seed in range(args.seeds):
            done = [r for r in rows if (r["game"], r["label"], r.get("seed")) ==
                    (args.game, args.label, seed) and r["env_steps"] >= args.steps - args.every]
            if not done:
                train_with_curves(args.game, args.label, args.set, seed, args.steps,
                                  args.every, args.episodes, out)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    report(rows, Path(args.plot) if args.plot else None)


if __name__ == "__main__":
    main()
