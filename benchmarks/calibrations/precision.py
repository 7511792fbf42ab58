"""bf16 against fp32 on this machine, for the shipped recipes: which `precision: auto` should pick.

    python -m benchmarks.calibrations.precision   # every recipe below, 2 rounds
    python -m benchmarks.calibrations.precision --recipes cartpole --rounds 3

Each row trains a recipe for a fixed number of env steps (its target return
off) in its own process, fp32 and bf16 interleaved round by round, and
reports the steady env-steps/s (median over the iterations after the first,
from the run's metrics.jsonl) and the bf16 / fp32 ratio. bf16 on a CPU
goes through gpusim's probe (gpusim.cpu_bf16), so the ISA it used is
printed too.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import machine

from gpusim.training.trained.learning_curves import read_metrics

RECIPES = {  # name -> (train arguments, env steps)
    "cartpole": (["--env", "cartpole"], 65_536),
    "acrobot": (["--env", "acrobot"], 65_536),
    "pendulum (ppo)": (["--env", "pendulum"], 65_536),
    "pendulum (sac)": (["--env", "pendulum", "--algorithm", "sac",
                        "--set", "trainer.learning_starts=1000"], 4_096),
    "tag_continuous": (["--env", "tag_continuous"], 65_536),
}


def run(args: list, steps: int, precision: str, results: Path) -> tuple[float, str]:
    """(steady env-steps/s, the ISA line gpusim printed or '') of one training process."""
    argv = [sys.executable, "-m", "gpusim.train", *args, "--backend", "cpu", "--quiet",
            "--total_steps", str(steps), "--results_dir", str(results),
            "--set", f"trainer.precision={precision}", "--set", "trainer.target_return=null",
            "--set", "trainer.final_eval_episodes=0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(args)} {precision} failed: "
                         f"{done.stderr.strip().splitlines()[-1:]}")
    run_dir = Path(next(line.split(": ", 1)[1] for line in done.stdout.splitlines()
                        if line.startswith("run directory: ")))
    rows = read_metrics(run_dir)
    rates = [r["env_steps_per_s"] for r in rows[1:]] or [rows[0]["env_steps_per_s"]]
    isa = next((line for line in done.stderr.splitlines() if "bf16" in line), "")
    return statistics.median(rates), isa


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(machine())
    rates = {(name, p): [] for name in args.recipes for p in ("fp32", "bf16")}
    isa_lines = set()
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for name in args.recipes:
                train_args, steps = RECIPES[name]
                for precision in ("fp32", "bf16"):
                    rate, isa = run(train_args, steps, precision, Path(tmp))
                    rates[(name, precision)].append(rate)
                    isa_lines.add(isa) if isa else None
    for line in sorted(isa_lines):
        print(line)
    print("\n| recipe | fp32 env-steps/s | bf16 env-steps/s | bf16 / fp32 |")
    print("|---|---|---|---|")
    for name in args.recipes:
        fp32, bf16 = rates[(name, "fp32")], rates[(name, "bf16")]
        ratios = [b / f for f, b in zip(fp32, bf16)]
        span = lambda xs: f"{min(xs):,.0f}-{max(xs):,.0f}"  # noqa: E731
        print(f"| {name} | {span(fp32)} | {span(bf16)} | "
              f"{min(ratios):.2f}-{max(ratios):.2f}x |")


if __name__ == "__main__":
    main()
