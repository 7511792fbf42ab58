"""League training against plain simultaneous training, at equal env steps: who is stronger?

    python benchmarks/league_strength.py                 # the study (about an hour on 2 cores)
    python benchmarks/league_strength.py --quick         # a smoke run: tiny budgets, one seed
    python benchmarks/league_strength.py --only simple_tag --out runs/league_strength

For each game (tag_continuous with 3 taggers and 8 runners, and simple_tag), every seed
trains twice with the env's recipe and the same env steps: `trainer.league=true` and
plain (`trainer.league=false`), league and plain runs interleaved so a busy machine
slows both alike. Then, with `python -m gpusim.league`:
- cross-play of every run's final policies against every other's (one matrix, the
  league runs first), read as: league X against plain Y and plain X against league Y,
  head to head (the league side's win rate under the matrix's median rule: above 1/2
  favours it), and against the same opponents (the league side's return minus the
  plain side's, over episodes paired by their start); and each run's Bradley-Terry
  rating;
- best responses: for each run and side, a fresh learner trained for `br` env steps
  against the run's other side's final network, frozen; its margin over the run's own
  side (lower: the frozen side is harder to exploit);
- throughput: each run's env steps/s from its `done:` line, league over plain.
Intervals are 95%, over episodes (the evaluation's noise; with 3 seeds, the seeds'
own spread shows in the per-seed counts and values). Every step's output is kept
under --out, and a step already done there is not run again (rerun to resume).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

GAMES = {  # training and best-response budgets (env steps), episodes per cell
    "tag_continuous": {"args": ["--env", "tag_continuous", "--set", "env.num_taggers=3",
                                "--set", "env.num_runners=8"],
                       "steps": 1_000_448, "br": 399_872, "episodes": 64,
                       "quick": {"steps": 20_480, "br": 10_240, "episodes": 8}},
    "simple_tag": {"args": ["--env", "simple_tag"],
                   "steps": 1_500_800, "br": 750_400, "episodes": 128,
                   "quick": {"steps": 32_000, "br": 16_000, "episodes": 8}},
}
DONE = re.compile(r"done: .*? ([\d,]+) env steps in ([\d.]+) s \(([\d,]+) steps/s\)")
Z95 = 1.96


def sh(command: list, log) -> str:
    """Run a command (printed first); its stdout, or exit with its error."""
    log("$ " + " ".join(command))
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-800:]}")
    return done.stdout


LEAGUE_SET: list = []  # --league_set: settings of the league runs alone


def train(game: str, mode: str, seed: int, budget: dict, out: Path, log) -> dict:
    folder = out / game / f"{mode}{seed}"
    record = folder / "train.json"
    if record.is_file():
        return json.loads(record.read_text())
    command = [sys.executable, "-m", "gpusim.train", *GAMES[game]["args"], "--seed", str(seed),
               "--total_steps", str(budget["steps"]), "--set",
               f"trainer.league={'true' if mode == 'league' else 'false'}",
               "--set", "trainer.final_eval_episodes=0", "--quiet", "--results_dir", str(folder)]
    if mode == "league":
        command += [arg for setting in LEAGUE_SET for arg in ("--set", setting)]
    cut = [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    if cut:  # a run stopped before its end (a signal): continue it from its checkpoint
        command = [sys.executable, "-m", "gpusim.train", "--resume", str(cut[0]), "--quiet"]
    start = time.perf_counter()
    stdout = sh(command, log)
    steps, seconds, rate = DONE.search(stdout).groups()
    (run_dir,) = [p for p in folder.iterdir() if p.is_dir()]
    result = {"run": str(run_dir), "env_steps": int(steps.replace(",", "")),
              "train_s": float(seconds), "env_steps_per_s": float(rate.replace(",", "")),
              "wall_s": round(time.perf_counter() - start, 1), "command": " ".join(command)}
    log(f"  {mode} seed {seed}: {result['env_steps']:,} env steps in {result['train_s']} s "
        f"({result['env_steps_per_s']:,.0f} steps/s)")
    record.write_text(json.dumps(result, indent=1))
    return result


def league_tool(args: list, result: Path, log) -> dict:
    if not result.is_file():
        sh([sys.executable, "-m", "gpusim.league", *args], log)
    return json.loads(result.read_text())


def mean_ci(values) -> tuple:
    values = list(values)
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, Z95 * statistics.stdev(values) / math.sqrt(len(values))


def fmt(value: tuple, digits: int = 3) -> str:
    return f"{value[0]:.{digits}f} +- {value[1]:.{digits}f}"


def crossplay_rows(cp: dict, n: int) -> list:
    """The matrix read as league against plain (players 0..n-1: league, n..2n-1: plain)."""
    x, y = cp["sides"]
    cell = {(c["i"], c["j"]): c["returns"] for c in cp["cells"]}
    median = cp["ratings"]["median"]
    league, plain = range(n), range(n, 2 * n)

    def outcome(v):
        return 1.0 if v > median else 0.5 if v == median else 0.0
    rows = []
    # head to head: league X vs plain Y (X's win rate), plain X vs league Y (Y's)
    won = [outcome(v) for i in league for j in plain for v in cell[(i, j)][x]["episodes"]]
    pairs = sum(statistics.mean(map(outcome, cell[(i, j)][x]["episodes"])) > 0.5
                for i in league for j in plain)
    rows.append((f"league {x} vs plain {y}: league {x}'s win rate", fmt(mean_ci(won)),
                 f"{pairs}/{n * n}"))
    won = [1.0 - outcome(v) for i in plain for j in league for v in cell[(i, j)][x]["episodes"]]
    pairs = sum(1.0 - statistics.mean(map(outcome, cell[(i, j)][x]["episodes"])) > 0.5
                for i in plain for j in league)
    rows.append((f"plain {x} vs league {y}: league {y}'s win rate", fmt(mean_ci(won)),
                 f"{pairs}/{n * n}"))
    # the same opponents: league X minus plain X against plain Y; league Y minus plain Y
    # against plain X (paired: seed k of each mode against the same opponent)
    for side, key in ((x, lambda k, o: ((k, o), (n + k, o))), (y, lambda k, o: ((o, k), (o, n + k)))):
        diffs, pairs = [], 0
        for k in league:
            for o in plain:
                a, b = key(k, o)
                d = [p - q for p, q in zip(cell[a][side]["episodes"], cell[b][side]["episodes"])]
                diffs += d
                pairs += statistics.mean(d) > 0
        other = y if side == x else x
        rows.append((f"{side}'s return against plain {other}: league minus plain",
                     fmt(mean_ci(diffs)), f"{pairs}/{n * n}"))
    for side in (x, y):
        rated = cp["ratings"]["players"][side]
        lo = [r["elo"] for r in rated[:n]]
        hi = [r["elo"] for r in rated[n:]]
        rows.append((f"{side}'s Bradley-Terry rating (Elo), mean: league / plain",
                     f"{statistics.mean(lo):.1f} / {statistics.mean(hi):.1f}",
                     f"{sum(a > b for a in lo for b in hi)}/{n * n}"))
    return rows


def br_rows(margins: dict, sides: list) -> list:
    """Per learning side: the margin against league runs' and plain runs' frozen side."""
    rows = []
    for side in sides:
        other = next(s for s in sides if s != side)
        parts = {}
        for mode in ("league", "plain"):
            got = [m[side] for m in margins[mode]]
            mean = statistics.mean(g["margin"]["mean"] for g in got)
            ci = math.sqrt(sum(g["margin"]["ci95"] ** 2 for g in got)) / len(got)
            raw = statistics.mean(g["best_response"][side]["mean"] for g in got)
            seeds = ", ".join(f"{g['margin']['mean']:.2f}" for g in got)
            parts[mode] = (mean, ci, raw, seeds)
        (lm, lc, lr, ls), (pm, pc, pr, ps) = parts["league"], parts["plain"]
        rows.append((f"exploiting {other}: a best response for {side}, its margin over the "
                     f"run's own {side}",
                     f"against league runs' {other}: {lm:.3f} +- {lc:.3f} (seeds {ls}; its "
                     f"return {lr:.3f}); against plain runs' {other}: {pm:.3f} +- {pc:.3f} "
                     f"(seeds {ps}; its return {pr:.3f})",
                     "lower against the league" if lm < pm else "NOT lower against the league"))
    return rows


def study(game: str, seeds: int, quick: bool, out: Path, log, scale: float = 1.0,
          best_responses: bool = True, first_seed: int = 0) -> dict:
    spec = GAMES[game]
    budget = dict(spec["quick"] if quick else {k: spec[k] for k in ("steps", "br", "episodes")})
    for key in ("steps", "br"):  # whole iterations: tag 512 env steps, simple_tag 1,600
        unit = 512 if game == "tag_continuous" else 1600
        budget[key] = max(unit, round(budget[key] * scale / unit) * unit)
    responses = f"best responses {budget['br']:,} env steps; " if best_responses else ""
    log(f"== {game}: {seeds} seed(s) x league and plain, {budget['steps']:,} env steps each; "
        f"{responses}{budget['episodes']} episodes per cell")
    runs = {"league": [], "plain": []}
    for seed in range(first_seed, first_seed + seeds):
        for mode in ("league", "plain"):
            runs[mode].append(train(game, mode, seed, budget, out, log))
    dirs = [r["run"] for r in runs["league"] + runs["plain"]]
    episodes = str(budget["episodes"])
    cp = league_tool([*dirs, "--episodes", episodes, "--out", str(out / game / "crossplay")],
                     out / game / "crossplay" / "league.json", log)
    sides = cp["sides"]
    margins = {"league": [], "plain": []}
    for k in range(seeds if best_responses else 0):
        for mode in ("league", "plain"):
            run = runs[mode][k]["run"]
            where = out / game / "br" / f"{mode}{first_seed + k}"
            margins[mode].append({side: league_tool(
                [run, "--best_response", side, "--budget", str(budget["br"]),
                 "--episodes", episodes, "--out", str(where)],
                where / f"best_response_{side}.json", log) for side in sides})
    rates = {mode: [r["env_steps_per_s"] for r in runs[mode]] for mode in runs}
    throughput = (f"league {statistics.mean(rates['league']):,.0f} / plain "
                  f"{statistics.mean(rates['plain']):,.0f} env steps/s (seeds: "
                  f"{', '.join(f'{v:,.0f}' for v in rates['league'])} / "
                  f"{', '.join(f'{v:,.0f}' for v in rates['plain'])})",
                  f"{statistics.mean(rates['league']) / statistics.mean(rates['plain']):.2f}x")
    return {"game": game, "budget": budget, "sides": sides, "runs": runs,
            "crossplay": crossplay_rows(cp, seeds),
            "best_response": br_rows(margins, sides) if best_responses else [],
            "throughput": throughput}


def table(results: list, header: str) -> str:
    lines = [header, "", "| game | measure | value (95% interval) | seed pairs / verdict |",
             "|---|---|---|---|"]
    for r in results:
        b = r["budget"]
        responses = f"best responses {b['br']:,}; " if r["best_response"] else ""
        lines.append(f"| {r['game']} | budgets | training {b['steps']:,} env steps per run; "
                     f"{responses}{b['episodes']} episodes per cell | |")
        for measure, value, verdict in r["crossplay"] + r["best_response"]:
            lines.append(f"| {r['game']} | {measure} | {value} | {verdict} |")
        lines.append(f"| {r['game']} | throughput | {r['throughput'][0]} | "
                     f"{r['throughput'][1]} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny budgets, one seed")
    parser.add_argument("--seeds", type=int, help="seeds per mode (default 3, --quick 1)")
    parser.add_argument("--first_seed", type=int, default=0,
                        help="seeds first_seed, first_seed+1, ... (fresh ones for a check)")
    parser.add_argument("--only", choices=tuple(GAMES), action="append")
    parser.add_argument("--budget_scale", type=float, default=1.0,
                        help="training and best-response budgets times this (a longer probe)")
    parser.add_argument("--no_best_response", action="store_true",
                        help="cross-play and throughput only")
    parser.add_argument("--league_set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config setting of the league runs (e.g. "
                        "trainer.league_learner_share=0.8); may be given again")
    parser.add_argument("--out", default=None, help="where runs and results go (default "
                        "runs/league_strength, or runs/league_strength_quick)")
    args = parser.parse_args(argv)
    LEAGUE_SET[:] = args.league_set
    seeds = args.seeds or (1 if args.quick else 3)
    out = Path(args.out or ("runs/league_strength" + ("_quick" if args.quick else "")))
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    flags = (" --quick" if args.quick else "") + (
        f" --budget_scale {args.budget_scale:g}" if args.budget_scale != 1 else "") + (
        " --no_best_response" if args.no_best_response else "") + (
        f" --first_seed {args.first_seed}" if args.first_seed else "") + "".join(
        f" --league_set {setting}" for setting in args.league_set)
    header = (f"league_strength{flags}: {machine()} | "
              f"{datetime.date.today()} | commit {commit} | {seeds} seed(s) per mode")

    def log(line):
        print(line, flush=True)
    log(header)
    results = [study(game, seeds, args.quick, out, log, args.budget_scale,
                     not args.no_best_response, args.first_seed)
               for game in args.only or GAMES]
    text = table(results, header) + f"\n\nwhole study: {time.perf_counter() - started:.0f} s"
    log("")
    log(text)
    (out / "league_strength.md").write_text(text + "\n")
    (out / "league_strength.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
