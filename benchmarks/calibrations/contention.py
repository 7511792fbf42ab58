"""Training throughput on a quiet CPU and on one that another process keeps busy.

    python -m benchmarks.calibrations.contention   # 3 rounds, every workload
    python -m benchmarks.calibrations.contention --rounds 5 --baseline ../gpusim-old

Workloads, each a fresh process, as a user starts it:
- gpusim cartpole PPO (the shipped recipe, a fixed number of steps);
- a fixed slice of the main job (`python -m gpusim.train --env tag_continuous`,
  its first iterations, no evaluation);
- gpusim pendulum SAC (the shipped sac.yaml, a fixed number of steps);
- the peer: Stable-Baselines3 PPO on CartPole-v1, 8 envs, its defaults
  (skipped, with the command to install it, where it is missing; never a
  project dependency).
Conditions: quiet, then with a hog (one busy loop this script starts and
stops, holding one core). Every round runs every workload in both
conditions, so slow periods of a shared machine fall on all of them; the
table gives the median and the range over the rounds, and the ratio of the
medians (with hog / quiet). gpusim's throughput is its training time's
(the "done:" line: compiling and start-up excluded); SB3's is `learn`'s.

`--baseline DIR` also runs the gpusim workloads from another checkout (its
`.venv`), side by side, e.g. the commit before a change; repeat it for more
checkouts (rows named by the folder). `--dedicated` also runs them with the
README's setting for a quiet machine of one's own (torch on every core,
`OMP_WAIT_POLICY=ACTIVE`), rows named "dedicated". `--also WORKLOAD KEY=VALUE` also runs
the workloads whose name contains WORKLOAD on this checkout with `--set KEY=VALUE` (rows
named by the setting), e.g. `--also "main job" trainer.score_envs=0`: the main job without
its score's evaluation replicas, like for like with a checkout that had none.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# machine() imports torch, not gpusim: the children set their own threads
from benchmarks.common import ROOT, machine

GPUSIM_WORKLOADS = {  # name -> python -m gpusim.train arguments
    "cartpole PPO": ["--env", "cartpole", "--total_steps", "131072",
                     "--set", "trainer.target_return=null"],
    "tag_continuous main job, first 50 iterations": [
        "--env", "tag_continuous", "--total_steps", "25600",
        "--set", "trainer.final_eval_episodes=0"],
    "pendulum SAC": ["--env", "pendulum", "--algorithm", "sac", "--total_steps", "6400",
                     "--set", "trainer.target_return=null"],
}
SB3_NAME = "SB3 PPO CartPole-v1, 8 envs"
SB3_STEPS = 40960
DONE = re.compile(r"^done.*\(([\d,]+) steps/s\)", re.MULTILINE)
HOG = "while True:\n    pass\n"
# the README's setting for a quiet machine of one's own: torch's threads on every core, spinning
DEDICATED_ENV = {"OMP_WAIT_POLICY": "ACTIVE"}


def dedicated_args() -> list[str]:
    return ["--set", f"trainer.torch_threads={len(os.sched_getaffinity(0))}"]


def run_gpusim(python: str, cwd: Path, args: list[str], results: str,
               environ: dict | None = None) -> float:
    argv = [python, "-m", "gpusim.train", *args, "--backend", "cpu", "--quiet",
            "--results_dir", results, "--set", "trainer.checkpoint_every=100000"]
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, **(environ or {})})
    match = DONE.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"error: {' '.join(args)} failed ({done.returncode}): "
                         f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return float(match.group(1).replace(",", ""))


def run_sb3() -> float:
    """SB3's PPO on CartPole-v1 in this process: env steps per second of `learn`."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=0), seed=0,
                device="cpu", verbose=0)
    start = time.perf_counter()
    model.learn(SB3_STEPS)
    return model.num_timesteps / (time.perf_counter() - start)


def sb3_missing() -> str | None:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return "stable-baselines3 is not installed (pip install stable-baselines3)"
    return None


def sb3_in_child() -> float:
    done = subprocess.run([sys.executable, "-m", __spec__.name, "--sb3-child"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"error: the SB3 run failed: {done.stderr.strip().splitlines()[-1:]}")
    return float(done.stdout.split()[-1])


def workloads(baselines: list[Path], results: str, dedicated: bool = False,
              also: list | None = None) -> dict:
    """name -> a function running it once and returning env steps per second."""
    here = Path(sys.executable)
    out = {}
    for name, args in GPUSIM_WORKLOADS.items():
        out[f"gpusim {name}"] = lambda a=args: run_gpusim(str(here), ROOT, a, results)
        for part, setting in also or ():
            if part in name:
                out[f"{setting} {name}"] = lambda a=[*args, "--set", setting]: run_gpusim(
                    str(here), ROOT, a, results)
        if dedicated:
            out[f"dedicated {name}"] = lambda a=args: run_gpusim(
                str(here), ROOT, [*a, *dedicated_args()], results, DEDICATED_ENV)
        for tree in baselines:
            python = str(tree / ".venv" / "bin" / "python")
            out[f"{tree.name} {name}"] = \
                lambda a=args, p=python, t=tree: run_gpusim(p, t, a, results)
    if sb3_missing() is None:
        out[SB3_NAME] = sb3_in_child
    return out


class Hog:
    """One busy loop in its own process, holding a core while it runs."""

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-c", HOG])
        return self

    def __exit__(self, *exc):
        self.process.kill()
        self.process.wait()


def measure(runs: dict, rounds: int) -> dict:
    """(workload, condition) -> rates, every workload in both conditions each round."""
    rates = {}
    for r in range(rounds):
        for condition in ("quiet", "hog"):
            with Hog() if condition == "hog" else contextlib.nullcontext():
                for name, run in runs.items():
                    rate = run()
                    rates.setdefault((name, condition), []).append(rate)
                    print(f"round {r + 1}/{rounds} {condition:5s} {name}: {rate:,.0f} steps/s "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)
    return rates


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def report(rates: dict, names: list[str], baselines: list[Path], dedicated: bool = False,
           also: list | None = None):
    print("\n| workload | quiet: median (range) | with hog: median (range) | ratio |")
    print("|---|---:|---:|---:|")
    for name in names:
        quiet, hog = rates[(name, "quiet")], rates[(name, "hog")]
        print(f"| {name} | {cell(quiet)} | {cell(hog)} | "
              f"{statistics.median(hog) / statistics.median(quiet):.2f}x |")
    med = {key: statistics.median(v) for key, v in rates.items()}
    cartpole = "gpusim cartpole PPO"
    for condition in ("quiet", "hog"):
        if (SB3_NAME, condition) in med:
            print(f"{condition}: gpusim cartpole / SB3 = "
                  f"{med[(cartpole, condition)] / med[(SB3_NAME, condition)]:.1f}x")
        for name in GPUSIM_WORKLOADS:
            rows = [tree.name for tree in baselines]
            for other in rows:
                print(f"{condition}: {name}, this checkout / {other} = "
                      f"{med[(f'gpusim {name}', condition)] / med[(f'{other} {name}', condition)]:.2f}x")
            for part, setting in also or ():
                for other in rows if part in name else ():
                    print(f"{condition}: {name}, this checkout with {setting} / {other} = "
                          f"{med[(f'{setting} {name}', condition)] / med[(f'{other} {name}', condition)]:.2f}x")
            for other in rows if dedicated else ():
                print(f"{condition}: {name}, dedicated / {other} = "
                      f"{med[(f'dedicated {name}', condition)] / med[(f'{other} {name}', condition)]:.2f}x")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, metavar="DIR", action="append", default=[],
                        help="another gpusim checkout with its own .venv, run side by side "
                             "(repeatable)")
    parser.add_argument("--dedicated", action="store_true",
                        help="also run gpusim's workloads with the README's setting for a "
                             "quiet machine of one's own (torch on every core, spinning)")
    parser.add_argument("--also", nargs=2, action="append", default=[],
                        metavar=("WORKLOAD", "KEY=VALUE"),
                        help="also run the workloads whose name contains WORKLOAD on this "
                             "checkout with --set KEY=VALUE (repeatable)")
    parser.add_argument("--sb3-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sb3_child:
        print(f"{run_sb3():.1f}")
        return
    for tree in args.baseline:
        if not (tree / ".venv/bin/python").exists():
            raise SystemExit(f"error: --baseline {tree} has no .venv/bin/python")
    if len({tree.name for tree in args.baseline}) < len(args.baseline):
        raise SystemExit("error: --baseline folders need different names (they name the rows)")
    print(machine())
    print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    missing = sb3_missing()
    if missing:
        print(f"{SB3_NAME}: skipped, {missing}")
    with tempfile.TemporaryDirectory() as results:
        runs = workloads(args.baseline, results, args.dedicated, args.also)
        rates = measure(runs, args.rounds)
    print(f"load average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    report(rates, list(runs), args.baseline, args.dedicated, args.also)


if __name__ == "__main__":
    main()
