"""League training against plain training at equal env steps, judged against a held-out panel.

    python -m benchmarks.learning.league_strength           # the protocol (about 90 min on 2 cores)
    python -m benchmarks.learning.league_strength --quick   # a smoke run: tiny budgets, 2 seeds
    python -m benchmarks.learning.league_strength --only simple_tag --seeds 2 --budget_scale 0.05

Per game (simple_tag: 8 seeds per mode; tag_continuous with 3 taggers and 8 runners: 4),
every seed trains twice with the env's recipe at the same env steps: `trainer.league=true`
and plain, interleaved so a busy machine slows both alike, each keeping 4 snapshots
(`trainer.keep_snapshots`: at 25%, 50%, 75% and 100% of its iterations).

Players judged, per side and seed: the league's final network, the plain run's final,
and the plain run's snapshot at 75% of its steps: a league learner trains on 3/4 of the
replicas (`league_learner_share` 0.5 and its own quarter), so that snapshot has seen as
many learner samples as the league's final ("plain@75%").

The held-out panel, per side: every plain seed's final and its 50% snapshot (other
seeds' plain policies, finals and intermediate) and the fixed opponents (random, the
env's scripted chaser and fleer). Only judged-against-panel cells are played (no
judged player meets another), and a judged player's cells against its own seed's panel
players are left out of its statistics. A cell's episodes are won by the env's outcome
(gpusim.outcome: tag_continuous's runner survival against the rectangle's median),
else by the return against the rectangle's median (simple_tag), ties half.

Statistics (`panel_scores`, `seed_ci`, `paired_ci`): per judged player its mean win rate
over the panel (each opponent weighing alike) and its worst case (the lowest win rate
against any one panel opponent); across seeds, a 95% t-interval of each mode's mean, and
of league minus plain (and minus plain@75%) paired by seed. Best responses: for each run
and side S, a learner started from the run's own S network trains for half the run's
budget against the run's other side's final network (`--best_response S --warm_start`);
its margin over the run's own S (lower: harder to exploit), with the same intervals.
Every step's output is kept under --out; a step already done there is not run again.
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

from benchmarks.common import machine

GAMES = {  # training budget (env steps), seeds per mode, episodes per cell
    "simple_tag": {"args": ["--env", "simple_tag"], "steps": 1_500_800, "seeds": 8,
                   "episodes": 64, "unit": 1600,
                   "quick": {"steps": 32_000, "episodes": 8}},
    "tag_continuous": {"args": ["--env", "tag_continuous", "--set", "env.num_taggers=3",
                                "--set", "env.num_runners=8"],
                       "steps": 1_000_448, "seeds": 4, "episodes": 32, "unit": 512,
                       "quick": {"steps": 20_480, "episodes": 8}},
}
DONE = re.compile(r"done: .*? ([\d,]+) env steps in ([\d.]+) s \(([\d,]+) steps/s\)")
KEEP = 4  # snapshots per run: 25%, 50%, 75%, 100%
# two-sided 95% quantiles of Student's t by degrees of freedom (seed-level intervals)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131}


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
               "--set", "trainer.final_eval_episodes=0", "--set", f"trainer.keep_snapshots={KEEP}",
               "--set", "trainer.target_score=null",  # (equal env steps: no early stop)
               "--quiet", "--results_dir", str(folder)]
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


# ---- statistics (tests/training/test_league_strength.py checks them on a known matrix) -------
def seed_ci(values) -> tuple:
    """(mean, half-width of its 95% t-interval) over seeds; nan with fewer than two."""
    values = list(values)
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    t = T95.get(len(values) - 1, 1.96)
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def paired_ci(a: dict, b: dict) -> tuple:
    """seed_ci of a[seed] - b[seed] over the seeds both have."""
    return seed_ci(a[k] - b[k] for k in sorted(a) if k in b)


def panel_scores(wins: dict, judged: list, panel: list, seed_of: dict) -> dict:
    """Per judged player: its mean win rate over the panel opponents not of its own seed
    (each opponent weighing alike) and its worst case (the lowest against any of them).
    `wins[(judged, opponent)]`: the judged player's per-episode wins (1, 1/2, 0);
    `seed_of`: a player's seed (panel players of no seed: None)."""
    out = {}
    for j in judged:
        rates = [statistics.mean(wins[(j, p)]) for p in panel
                 if seed_of.get(p) is None or seed_of[p] != seed_of[j]]
        out[j] = {"mean": statistics.mean(rates), "worst": min(rates), "opponents": len(rates)}
    return out


def mode_rows(scores: dict, modes: dict, side: str) -> list:
    """Table rows of one side: each mode's mean and worst case over seeds, and the league
    minus each plain mode, paired by seed. `modes`: mode -> {seed: judged player}."""
    rows = []
    for what in ("mean", "worst"):
        per = {m: {k: scores[p][what] for k, p in players.items()} for m, players in modes.items()}
        for m in modes:
            rows.append((f"{side}: {m}, {what} win rate against the panel",
                         fmt(seed_ci(per[m].values())), _seeds(per[m])))
        for m in modes:
            if m != "league":
                diff = paired_ci(per["league"], per[m])
                ahead = sum(per["league"][k] > per[m][k] for k in per["league"] if k in per[m])
                rows.append((f"{side}: league minus {m}, {what} (paired by seed)", fmt(diff),
                             f"league ahead on {ahead}/{len(per[m])} seeds; "
                             + _verdict(diff)))
    return rows


def _seeds(values: dict) -> str:
    return "seeds " + ", ".join(f"{values[k]:.3f}" for k in sorted(values))


def _verdict(ci: tuple) -> str:
    mean, half = ci
    if math.isnan(half):
        return "one seed: no interval"
    return ("the league wins" if mean - half > 0 else "the league loses"
            if mean + half < 0 else "no difference shown")


def fmt(value: tuple, digits: int = 3) -> str:
    return f"{value[0]:.{digits}f} +- {value[1]:.{digits}f}"


# ---- the protocol --------------------------------------------------------------------
def judge(game: str, runs: dict, episodes: int, out: Path, log) -> dict:
    """Every judged player against the held-out panel, per side (see the module)."""
    from gpusim.training.judge import ratings
    from gpusim.training.judge.crossplay import cross_play
    from gpusim.training.judge.league_cli import env_maker
    from gpusim.training.judge.players import open_run, panel_players, snapshot_players
    record = out / game / "panel.json"
    if record.is_file():
        return json.loads(record.read_text())
    opened = {m: {k: open_run(r["run"]) for k, r in runs[m].items()} for m in runs}
    first = next(iter(opened["plain"].values()))
    sides = first.sides
    judged, panel, seed_of = {s: [] for s in sides}, {s: [] for s in sides}, {}
    for mode in ("league", "plain"):
        for seed, run in opened[mode].items():
            kept = snapshot_players(run)  # (KEEP snapshots, the last equal to the final)
            for side in sides:
                snaps = {p.label: p for p in kept[side]}
                steps = sorted(p.update for p in kept[side] if not p.final)
                named = {f"{mode}{seed}": snaps["final"]}
                if mode == "plain":
                    named[f"plain@75%{seed}"] = next(p for p in kept[side]
                                                     if p.update == steps[-1])
                    panel[side] += [(f"panel:plain{seed}", snaps["final"]),
                                    (f"panel:plain{seed}@50%",
                                     next(p for p in kept[side] if p.update == steps[-2]))]
                    seed_of[f"panel:plain{seed}"] = seed_of[f"panel:plain{seed}@50%"] = seed
                for label, player in named.items():
                    judged[side].append((label, player))
                    seed_of[label] = seed
    fixed = panel_players(first)
    for side in sides:
        panel[side] += [(f"panel:{p.label}", p) for p in fixed[side]]
    make = env_maker(first, 12345, threads=True)
    declared = first.cls.outcome
    result = {"sides": sides, "episodes": episodes, "seed_of": seed_of, "scores": {},
              "outcome": None if declared is None else declared.name}
    for k, side in enumerate(sides):
        other = sides[1 - k]
        players = {side: [p for _, p in judged[side]], other: [p for _, p in panel[other]]}
        log(f"  {side}: {len(players[side])} judged x {len(players[other])} panel players, "
            f"{episodes} episodes per cell")
        cells = cross_play(make, sides, players, episodes, min(episodes, 1024), 1024, 12345)
        if k == 1:  # cells are keyed (X player, Y player): the judged side is Y here
            cells = {(j, i): cell for (i, j), cell in cells.items()}
        per_episode, _, rule = ratings.episode_wins(cells, side, declared, sides)
        wins = {(judged[side][j][0], panel[other][p][0]): w
                for (j, p), w in per_episode.items()}
        result["scores"][side] = panel_scores(wins, [n for n, _ in judged[side]],
                                              [n for n, _ in panel[other]], seed_of)
        result.setdefault("rules", {})[side] = rule
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(result, indent=1))
    return result


def study(game: str, seeds: int, quick: bool, out: Path, log, scale: float = 1.0,
          best_responses: bool = True, first_seed: int = 0) -> dict:
    spec = GAMES[game]
    budget = dict(spec["quick"] if quick else {k: spec[k] for k in ("steps", "episodes")})
    unit = spec["unit"]  # whole iterations: simple_tag 1,600 env steps, tag 512
    budget["steps"] = max(4 * unit, round(budget["steps"] * scale / unit) * unit)
    budget["br"] = max(unit, round(budget["steps"] / 2 / unit) * unit)
    log(f"== {game}: {seeds} seed(s) x league and plain, {budget['steps']:,} env steps each; "
        f"{budget['episodes']} episodes per cell"
        + (f"; warm-started best responses {budget['br']:,}" if best_responses else ""))
    runs = {"league": {}, "plain": {}}
    for seed in range(first_seed, first_seed + seeds):
        for mode in ("league", "plain"):
            runs[mode][seed] = train(game, mode, seed, budget, out, log)
    judged = judge(game, runs, budget["episodes"], out, log)
    rows = []
    for side in judged["sides"]:
        scores = judged["scores"][side]
        modes = {"league": {k: f"league{k}" for k in runs["league"]},
                 "plain": {k: f"plain{k}" for k in runs["plain"]},
                 "plain@75%": {k: f"plain@75%{k}" for k in runs["plain"]}}
        rows += mode_rows(scores, modes, side)
    if best_responses:
        rows += br_rows(game, runs, judged["sides"], budget, out, log)
    rates = {mode: [r["env_steps_per_s"] for r in runs[mode].values()] for mode in runs}
    throughput = (f"league {statistics.mean(rates['league']):,.0f} / plain "
                  f"{statistics.mean(rates['plain']):,.0f} env steps/s",
                  f"{statistics.mean(rates['league']) / statistics.mean(rates['plain']):.2f}x")
    return {"game": game, "budget": budget, "seeds": seeds, "rules": judged["rules"],
            "runs": runs, "rows": rows, "throughput": throughput}


def br_rows(game: str, runs: dict, sides: list, budget: dict, out: Path, log) -> list:
    """Per side S: warm-started best responses' margins against league and plain runs."""
    rows = []
    for side in sides:
        margins = {}
        for mode in ("league", "plain"):
            margins[mode] = {}
            for seed, r in runs[mode].items():
                where = out / game / "br" / f"{mode}{seed}"
                got = league_tool([r["run"], "--best_response", side, "--warm_start",
                                   "--budget", str(budget["br"]), "--episodes",
                                   str(budget["episodes"]), "--out", str(where)],
                                  where / f"best_response_{side}.json", log)
                margins[mode][seed] = got["margin"]["mean"]
        other = next(s for s in sides if s != side)
        for mode in ("league", "plain"):
            rows.append((f"exploiting {mode} {other}: warm {side} best response's margin",
                         fmt(seed_ci(margins[mode].values())), _seeds(margins[mode])))
        diff = paired_ci(margins["league"], margins["plain"])
        rows.append((f"exploiting {other}: league minus plain margin (paired; lower: the "
                     "league is harder to exploit)", fmt(diff),
                     "lower against the league" if diff[0] + diff[1] < 0 else
                     "higher against the league" if diff[0] - diff[1] > 0 else
                     "no difference shown"))
    return rows


def table(results: list, header: str) -> str:
    lines = [header, "", "| game | measure | value (95% interval over seeds) | per seed / verdict |",
             "|---|---|---|---|"]
    for r in results:
        b = r["budget"]
        lines.append(f"| {r['game']} | budgets | {r['seeds']} seeds per mode; training "
                     f"{b['steps']:,} env steps per run; {b['episodes']} episodes per cell | |")
        for side, rule in r["rules"].items():
            lines.append(f"| {r['game']} | a win ({side}) | {rule} | |")
        for measure, value, verdict in r["rows"]:
            lines.append(f"| {r['game']} | {measure} | {value} | {verdict} |")
        lines.append(f"| {r['game']} | throughput | {r['throughput'][0]} | "
                     f"{r['throughput'][1]} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny budgets, 2 seeds")
    parser.add_argument("--seeds", type=int, help="seeds per mode (default: simple_tag 8, "
                        "tag_continuous 4; --quick 2)")
    parser.add_argument("--first_seed", type=int, default=0,
                        help="seeds first_seed, first_seed+1, ... (fresh ones for a check)")
    parser.add_argument("--only", choices=tuple(GAMES), action="append")
    parser.add_argument("--budget_scale", type=float, default=1.0,
                        help="training and best-response budgets times this")
    parser.add_argument("--no_best_response", action="store_true",
                        help="the panel and throughput only")
    parser.add_argument("--league_set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config setting of the league runs (e.g. "
                        "trainer.league_learner_share=0.8); may be given again")
    parser.add_argument("--out", default=None, help="where runs and results go (default "
                        "runs/league_strength, or runs/league_strength_quick)")
    args = parser.parse_args(argv)
    LEAGUE_SET[:] = args.league_set
    out = Path(args.out or ("runs/league_strength" + ("_quick" if args.quick else "")))
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    flags = (" --quick" if args.quick else "") + (
        f" --budget_scale {args.budget_scale:g}" if args.budget_scale != 1 else "") + (
        " --no_best_response" if args.no_best_response else "") + (
        f" --seeds {args.seeds}" if args.seeds else "") + (
        f" --first_seed {args.first_seed}" if args.first_seed else "") + "".join(
        f" --league_set {setting}" for setting in args.league_set)
    header = f"league_strength{flags}: {machine()} | {datetime.date.today()} | commit {commit}"

    def log(line):
        print(line, flush=True)
    log(header)
    results = []
    for game in args.only or GAMES:
        seeds = args.seeds or (2 if args.quick else GAMES[game]["seeds"])
        results.append(study(game, seeds, args.quick, out, log, args.budget_scale,
                             not args.no_best_response, args.first_seed))
    text = table(results, header) + f"\n\nwhole study: {time.perf_counter() - started:.0f} s"
    log("")
    log(text)
    (out / "league_strength.md").write_text(text + "\n")
    (out / "league_strength.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
