"""Where a league must pay: biased_rps, a game with a cycle, plain self-play against a league.

    python -m benchmarks.learning.league_cycles           # 8 seeds, about 8 minutes on 2 cores
    python -m benchmarks.learning.league_cycles --quick   # a smoke run: 2 seeds, tiny budgets
    python -m benchmarks.learning.league_cycles --seeds 4 --out runs/league_cycles

For each seed, biased_rps's recipe (config.yaml: no entropy bonus, lr 3e-3) trains
twice at equal env steps: plain self-play, and `trainer.league=true` with a pool of
`--capacity` snapshots taken evenly over the run (league_snapshot_every = iterations /
capacity, so the pool spans the whole run), its other league settings at their
defaults (pfsp opponents, half the replicas all-learners). Both keep `--capacity`
snapshots of their networks (trainer.keep_snapshots). The game is a matrix and a
network's mixed strategy its action distribution on the constant first observation
(training.judge.mixtures), so exploitability is exact (biased_rps.equilibrium: what both best
responses win, 0 exactly at the equilibrium (1/2, 1/6, 1/3)). Per seed:

- plain final / league final: the last networks of both sides;
- plain snapshot average: the uniform mixture of plain's kept snapshots (what averaging
  a plain run's history would give, without a league);
- league pool, uniform / pfsp: the mixture of the league's final pools, each snapshot
  weighted equally or as the league drew its opponents at the end.

The table gives each one's mean over seeds with a 95% bootstrap interval over seeds
(training.population.members.bootstrap_interval), and league minus plain per seed; the plot
(docs/images/league_cycles.png) the learners' exploitability over training. Runs kept
under --out are not trained again (rerun to resume or to redo the table).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numba
import numpy as np
import torch

from gpusim import train
from gpusim.envs.biased_rps.equilibrium import exploitability
from gpusim.training.judge import mixtures
from gpusim.training.run_config import load_run_config
from gpusim.training.judge.players import open_run
from gpusim.training.population.members import bootstrap_interval

from benchmarks.common import ROOT, machine

ENV = "biased_rps"
ROWS = (("plain final", "plain", "final"), ("plain snapshot average", "plain", "average"),
        ("league final", "league", "final"), ("league pool, uniform", "league", "uniform"),
        ("league pool, pfsp", "league", "pfsp"))
PAIRED = ((("league", "final"), ("plain", "final")), (("league", "uniform"), ("plain", "final")),
          (("league", "uniform"), ("plain", "average")))
UNIFORM = 4 / 3  # exploitability of uniform play by both sides (the defaults' wins)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--capacity", type=int, default=32,
                        help="league pool slots, and snapshots kept by both runs")
    parser.add_argument("--total_steps", type=int, default=None,
                        help="env steps per run (default: the recipe's)")
    parser.add_argument("--out", type=Path, default=Path("runs/league_cycles"))
    parser.add_argument("--plot", type=Path, default=ROOT / "docs/images/league_cycles.png")
    parser.add_argument("--quick", action="store_true", help="2 seeds, 8,192 steps, no plot")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="passed to both runs (e.g. trainer.lr=0.001)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.total_steps, args.plot = 2, 8192, None
    if args.seeds < 2:
        parser.error("--seeds must be at least 2 (the intervals are over seeds)")
    if args.capacity < 2:
        parser.error("--capacity must be at least 2")
    return args


def train_once(run_root: Path, argv: list) -> Path:
    """One training run into `run_root` (kept: not trained again); its run directory."""
    def finished() -> list:  # (a run stopped midway left no final snapshot)
        return sorted(p for p in run_root.glob("*/snapshots") if any(p.iterdir()))
    if run_root.is_dir() and finished():
        return finished()[-1].parent
    threads = torch.get_num_threads(), numba.get_num_threads()
    try:
        code = train.main([*argv, "--results_dir", str(run_root), "--quiet"])
    finally:  # the trainer binds this process's thread counts
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    if code:
        raise SystemExit(f"training {run_root} exited {code}")
    return finished()[-1].parent


def measure(run_dir: Path, league: bool) -> dict:
    """Exploitability of a run's finals, its snapshots over training and its mixtures."""
    run = open_run(run_dir)
    game = run.config.env
    obs = mixtures.first_observations(run)
    kept = mixtures.snapshot_strategies(run, obs)
    sides = list(run.finals)
    out = {"curve": [(it, exploitability(game, *(s[n] for n in sides))) for it, s in kept],
           "final": exploitability(game, *(mixtures.strategy(run.finals[n], obs[n])
                                           for n in sides))}
    average = [np.mean([s[n] for _, s in kept], axis=0) for n in sides]
    out["average"] = exploitability(game, *average)
    out["strategies"] = {n: mixtures.strategy(run.finals[n], obs[n]).round(3).tolist()
                         for n in sides}
    if league:
        for rule in ("uniform", "pfsp"):
            mixed = [mixtures.pool_mixture(run, n, obs[n], rule)[0] for n in sides]
            out[rule] = exploitability(game, *mixed)
            out[f"{rule}_strategies"] = {n: m.round(3).tolist() for n, m in zip(sides, mixed)}
    return out


def interval_text(values: list) -> str:
    low, high = bootstrap_interval(values)
    return f"{np.mean(values):.2f} [{low:.2f}, {high:.2f}]"


def table(results: dict) -> str:
    lines = ["| measure | exploitability, mean [95% interval over seeds] | per seed |",
             "|---|---|---|"]
    for label, kind, key in ROWS:
        values = [r[kind][key] for r in results.values()]
        lines.append(f"| {label} | {interval_text(values)} | "
                     f"{' '.join(f'{v:.2f}' for v in values)} |")
    for (kind, key), (base, base_key) in PAIRED:
        label = next(r[0] for r in ROWS if r[1:] == (kind, key))
        base_label = next(r[0] for r in ROWS if r[1:] == (base, base_key))
        lines.append(f"| {label} minus {base_label}, paired by seed | " + interval_text(
            [r[kind][key] - r[base][base_key] for r in results.values()]) + " | |")
    lines.append(f"| (yardstick: uniformly random play, both sides) | {UNIFORM:.2f} | |")
    return "\n".join(lines)


def plot(results: dict, path: Path, nash_note: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for kind, colour in (("plain", "tab:red"), ("league", "tab:blue")):
        curves = [r[kind]["curve"] for r in results.values()]
        iterations = [it for it, _ in curves[0]]
        values = np.array([[v for _, v in c] for c in curves])
        for row in values:
            ax.plot(iterations, row, color=colour, alpha=0.15, lw=0.8)
        ax.plot(iterations, values.mean(0), color=colour, lw=2,
                label=f"{kind}: its networks (mean of {len(values)} seeds)")
    pooled = [r["league"]["uniform"] for r in results.values()]
    ax.axhline(np.mean(pooled), color="tab:blue", ls="--",
               label="league: its final pool's uniform mixture (mean)")
    ax.axhline(UNIFORM, color="gray", ls=":", label="uniformly random play, both sides")
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set_xlabel("iteration")
    ax.set_ylabel("exploitability")
    ax.set_title(f"biased_rps: plain self-play against a league ({nash_note})", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv=None) -> int:
    args = parse_args(argv)
    print(machine(), flush=True)
    from gpusim.envs import env_class
    recipe = load_run_config(ENV, env_class(ENV)).trainer
    steps = args.total_steps or recipe.total_steps
    iterations = max(1, steps // recipe.steps_per_iteration)
    every = max(1, iterations // args.capacity)
    common = ["--env", ENV, "--total_steps", str(steps),
              "--set", f"trainer.keep_snapshots={args.capacity}"]
    for item in args.set:
        common += ["--set", item]
    league = ["--set", "trainer.league=true", "--set", f"trainer.league_capacity={args.capacity}",
              "--set", f"trainer.league_snapshot_every={every}"]
    print(f"{args.seeds} seeds x (plain, league), {steps:,} env steps each ({iterations} "
          f"iterations); league: {args.capacity} slots, a snapshot every {every} updates",
          flush=True)
    results = {}
    for seed in range(args.seeds):  # plain and league interleaved: a busy machine slows both
        runs = {}
        for kind, extra in (("plain", []), ("league", league)):
            run_dir = train_once(args.out / f"{kind}_seed{seed}",
                                 [*common, *extra, "--seed", str(seed)])
            runs[kind] = measure(run_dir, kind == "league")
        results[seed] = runs
        print(f"seed {seed}: plain final {runs['plain']['final']:.2f}, league final "
              f"{runs['league']['final']:.2f}, league pool (uniform) "
              f"{runs['league']['uniform']:.2f}", flush=True)
    text = table(results)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {"steps": steps, "capacity": args.capacity, "snapshot_every": every, "set": args.set,
         "seeds": results}, indent=1))
    if args.plot is not None:
        plot(results, args.plot, "0 is the equilibrium")
    return 0


if __name__ == "__main__":
    sys.exit(main())
