"""Judge the strength of a league's players: cross-play, ratings, best responses.

    python -m gpusim.league RUN_DIR                    # a league run's snapshots and finals
    python -m gpusim.league RUN_A RUN_B                # runs' final policies, crossed
    python -m gpusim.league RUN_DIR --best_response runner --budget 200000

For an env of two policies (sides X and Y, in the env's order): a matrix of every X
player against every Y player (training.judge.crossplay), each cell `--episodes` episodes
with both sides' mean returns and 95% intervals; a Bradley-Terry fit of every player's
rating from those games (training.judge.ratings), and league.png, the ratings against the
update each snapshot was taken at. Players: a league run's pooled snapshots and final
networks (training.judge.players); or, given several runs of one env, each run's
final networks (run A's X against run B's Y, and every other pairing).

--best_response SIDE trains a fresh learner for SIDE against the run's final network
of the other side, frozen, for --budget env steps (default: the run's own), and
reports its margin over the run's own SIDE against that network
(training.judge.best_response). Everything goes to league.json (best_response_SIDE.json)
in the first run's directory, or --out.
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

from gpusim.arguments import ArgumentParser, int_in
from gpusim.errors import GpusimError, writing
from gpusim.scale.device import DeviceContext
from gpusim.scale.threads import Work

from ..work import run_work
from . import best_response as br
from . import ratings, transitivity
from .crossplay import OUTCOME, batches, cross_play, mean_ci
from .players import check_alike, league_players, open_run, panel_players, run_players

COLUMN = 15


def env_maker(run, seed: int, threads: bool = False):
    """num_envs -> the run's env (its config, its backend: the CPU where auto finds no
    GPU), seeded `seed`; one per size. `threads`: on the CPU, the thread counts a
    training rollout of that many replicas would take (gpusim.scale.threads)."""
    config = run.config
    backend = "cpu" if config.trainer.backend == "auto" and not torch.cuda.is_available() \
        else config.trainer.backend
    built = {}
    context = DeviceContext() if threads else None
    if context is not None:
        context.bind(backend, quiet=True)

    def make(num_envs: int):
        if num_envs not in built:
            built.clear()  # one env at a time
            env = built[num_envs] = run.cls(num_envs=num_envs, backend=backend, seed=seed,
                                            config=config.env)
            if context is not None:
                work = run_work(config, env)
                context.fit_threads(Work(rollout_macs=work.rollout_macs,
                                         env_obs_values=work.env_obs_values))
        return built[num_envs]
    return make


def judge(run_dirs: list, episodes: int = 16, max_replicas: int = 1024, seed: int = 12345,
          deterministic: bool = False, out=None, log=print, threads: bool = False,
          panel: bool = False) -> dict:
    """Cross-play, ratings and their plot for a league run, or for several runs' finals;
    league.json (and league.png) in `out` (default: the first run's directory).
    `threads`: choose the CPU thread counts (the command does; a caller keeps its own).
    `panel`: fixed opponents join each side (random, and the env's scripted policies)."""
    runs = [open_run(path) for path in run_dirs]
    check_alike(runs)
    first, sides = runs[0], runs[0].sides
    x, y = sides
    out = output_folder(out, first.path)
    players = league_players(first) if len(runs) == 1 else run_players(runs)
    if panel:  # (random acting "deterministically" would take choice 0 always: left out)
        fixed = panel_players(first)
        players = {side: players[side] + [p for p in fixed[side]
                                          if not (deterministic and p.scripted is None)]
                   for side in sides}
    per_cell = min(episodes, max_replicas)
    nx, ny = len(players[x]), len(players[y])
    parts = len(batches(players[x], players[y], per_cell, max_replicas))
    acting = "deterministic" if deterministic else "sampled"
    log(f"{first.config.env_name}: {nx} {x} x {ny} {y} players, {episodes} episodes per cell "
        f"on {per_cell} replicas each ({nx * ny} cells in {parts} batch"
        f"{'es' if parts > 1 else ''}), seed {seed}, {acting} actions")
    if len(runs) > 1:
        for player, run in zip(players[x], runs):
            log(f"  {player.label} = {run.path}")
    cells = cross_play(env_maker(first, seed, threads), sides, players, episodes, per_cell,
                       max_replicas, seed, deterministic)
    declared = first.cls.outcome  # the env's own outcome (None: by the returns' median)
    rated = ratings.ratings(cells, sides, players, declared)
    table = [{"i": i, "j": j, x: players[x][i].label, y: players[y][j].label,
              "returns": {n: {**dict(zip(("mean", "ci95"), mean_ci(cell[n]))),
                              "episodes": cell[n]} for n in sides},
              **({} if OUTCOME not in cell else {"outcome": {
                  **dict(zip(("mean", "ci95"), mean_ci(cell[OUTCOME]))),
                  "episodes": cell[OUTCOME]}})}
             for (i, j), cell in sorted(cells.items())]
    for side in sides:
        log(f"{side}'s mean episode return, +- its 95% interval (rows: {x}, columns: {y})")
        log(_matrix(players, sides, cells, side))
    log(f"ratings (Bradley-Terry, Elo points, +- 95%): {rated['outcome']}")
    for side in sides:
        for row in rated["players"][side]:
            log(f"  {side:<10} {row['label']:<8} {row['elo']:8.1f} +- {row['ci95']:.1f}")
    result = {"env": first.config.env_name, "runs": [str(r.path) for r in runs],
              "sides": sides, "episodes": episodes, "replicas_per_cell": per_cell,
              "seed": seed, "deterministic": deterministic,
              "outcome": None if declared is None else declared.name,
              "players": {n: [p.describe() for p in players[n]] for n in sides},
              "cells": table, "ratings": rated}
    if len(runs) == 1:  # one run's past selves: does its training climb, cycle or forget?
        result["transitivity"] = transitivity.summary(cells, sides, players, declared)
        transitivity.report(result["transitivity"], sides, log)
        drawn = transitivity.plot(cells, sides, players, f"{first.path.name}: cross-play",
                                  out / "transitivity.png")
        log(f"saved {drawn}" if drawn else "transitivity.png not drawn: matplotlib is missing")
    with writing(out / "league.json"):
        (out / "league.json").write_text(json.dumps(result, indent=1))
    log(f"saved {out / 'league.json'}")
    drawn = ratings.plot(rated, sides, f"{first.path.name}: ratings", out / "league.png",
                         over_training=len(runs) == 1)
    log(f"saved {drawn}" if drawn else "league.png not drawn: matplotlib is not installed "
        "(pip install 'gpusim[plot]')")
    return result


def best_response(run_dir, side: str, budget: int | None = None, episodes: int = 16,
                  max_replicas: int = 1024, seed: int = 12345, deterministic: bool = False,
                  out=None, log=print, warm: bool = False) -> dict:
    """Train a best response for `side` of a run and measure its margin (see the module);
    best_response_SIDE.json in `out` (default: the run's directory). `warm`: it starts
    from the run's own `side` network."""
    run = open_run(run_dir)
    if side not in run.sides:
        raise GpusimError(f"--best_response: {run.config.env_name} has sides "
                          f"{' and '.join(run.sides)}, not {side!r}")
    other = next(name for name in run.sides if name != side)
    budget = budget or run.config.trainer.total_steps
    br.check_budget(run, budget)
    out = output_folder(out, run.path)
    start = f"{side} learner from the run's own {side}" if warm else f"fresh {side} learner"
    log(f"{run.path.name}: a {start} trains {budget:,} env steps against "
        f"{other}'s final network, frozen")
    response, figures = br.train_best_response(run, side, budget, log, warm)
    per_cell = min(episodes, max_replicas)
    result = br.margin(run, side, response, env_maker(run, seed, True), episodes, per_cell,
                       max_replicas, seed, deterministic)
    log(f"{episodes} episodes each, seed {seed}, "
        f"{'deterministic' if deterministic else 'sampled'} actions; mean and 95% interval")
    br.report(side, other, result, log)
    saved = {"run": str(run.path), "side": side, "frozen": other, "training": figures,
             "episodes": episodes, "seed": seed, "deterministic": deterministic, **result}
    path = out / f"best_response_{side}.json"
    with writing(path):
        path.write_text(json.dumps(saved, indent=1))
    log(f"saved {path}")
    return saved


def output_folder(out, default: Path) -> Path:
    """The folder results go to (made if missing), checked before anything is played."""
    out = Path(out) if out is not None else default
    if out.exists() and not out.is_dir():
        raise GpusimError(f"--out {out} is a file: name a folder")
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)
    return out


def _matrix(players: dict, sides: list, cells: dict, side: str) -> str:
    x, y = sides
    width = max(8, max(len(p.label) for p in players[x]) + 2)
    lines = [" " * width + "".join(f"{p.label:>{COLUMN}}" for p in players[y])]
    for i, p in enumerate(players[x]):
        row = []
        for j in range(len(players[y])):
            mean, ci = mean_ci(cells[(i, j)][side])
            row.append(f"{mean:.2f}+-{'inf' if ci is None else f'{ci:.2f}'}".rjust(COLUMN))
        lines.append(f"{p.label:<{width}}" + "".join(row))
    return "\n".join("  " + line for line in lines)


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m gpusim.league", description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="a league run, or several runs of one env (their finals)")
    parser.add_argument("--episodes", type=int_in(2), default=16,
                        help="episodes per cell (a confidence interval needs two)")
    parser.add_argument("--num_envs", type=int_in(1), default=1024,
                        help="replicas stepped at once at most (cells are batched to fit)")
    parser.add_argument("--seed", type=int_in(0, 2**64 - 1), default=12345)
    parser.add_argument("--deterministic", action="store_true",
                        help="players take their most likely action")
    parser.add_argument("--out", help="folder for league.json and league.png (default: the "
                                      "first run's directory)")
    parser.add_argument("--panel", action="store_true",
                        help="fixed opponents join each side: uniformly random actions and "
                             "the env's scripted policies (a chaser, a fleer)")
    parser.add_argument("--best_response", metavar="SIDE",
                        help="train a fresh learner for SIDE against the other side's final "
                             "network and report its margin")
    parser.add_argument("--warm_start", action="store_true",
                        help="--best_response: start from the run's own SIDE network")
    parser.add_argument("--budget", type=int_in(1), metavar="STEPS",
                        help="--best_response: its env steps (default: the run's total_steps)")
    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if args.warm_start and args.best_response is None:
                raise GpusimError("--warm_start is the --best_response learner's: add "
                                  "--best_response SIDE")
            if args.budget is not None and args.best_response is None:
                raise GpusimError("--budget is the --best_response learner's: add "
                                  "--best_response SIDE")
            if args.best_response is not None:
                if len(args.run_dirs) != 1:
                    raise GpusimError("--best_response takes one run directory, got "
                                      f"{len(args.run_dirs)}")
                best_response(args.run_dirs[0], args.best_response, args.budget,
                              args.episodes, args.num_envs, args.seed, args.deterministic,
                              args.out, warm=args.warm_start)
            else:
                judge(args.run_dirs, args.episodes, args.num_envs, args.seed,
                      args.deterministic, args.out, threads=True, panel=args.panel)
    except GpusimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    return 0
