"""Do two checkouts train alike? The first iterations' losses and returns, case by case.

    python -m benchmarks.release.same_results run --out new.json                 # this checkout
    OTHER/.venv/bin/python -m benchmarks.release.same_results run --out old.json   # another
    python -m benchmarks.release.same_results compare old.json new.json

(each from this checkout's root; `run` trains with the gpusim of the python that runs it)

`run` trains each case through the command line as a user would (`python -m
gpusim.train ... --quiet`, the cpu backend, one torch thread, compile off, a
fixed seed) for a few iterations and keeps every line of its metrics.jsonl.
`compare` prints, per case, the largest relative difference over every loss,
statistic and return of every iteration (relative to the larger of the value
and 1e-3: a loss near 0 is compared absolutely), and whether it is bitwise
equal; a case passes at a relative difference of at most 1e-6. Times and
throughputs are left out. A second table holds each population's member m0
against the solo run of the same seed, in each checkout: how far a member is
from the run it stands for.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

TAG = ["env.num_taggers=2", "env.num_runners=6", "env.num_other_agents_observed=4"]
OFF_POLICY = ["trainer.learning_starts=64", "trainer.num_envs=4", "trainer.rollout_len=8",
              "policy.hidden_sizes=[32,32]"]

# name -> (env, --set values, total steps)
CASES = {
    "ppo": ("cartpole", ["trainer.num_envs=8", "trainer.rollout_len=32"], 768),
    "a2c": ("cartpole", ["trainer.algorithm=a2c", "trainer.update_epochs=1",
                         "trainer.num_minibatches=1", "trainer.num_envs=8",
                         "trainer.rollout_len=32"], 768),
    "mappo (central critic)": ("simple_spread", ["policy.critic=central", "trainer.num_envs=8",
                                                 "trainer.rollout_len=25"], 600),
    "ppo, recurrent": ("cartpole", ["policy.recurrent=gru", "policy.bptt_len=8",
                                    "trainer.num_envs=8", "trainer.rollout_len=32"], 768),
    "ppo, masked": ("tag_gridworld", ["env.mask_walls=true", "trainer.num_envs=8",
                                      "trainer.rollout_len=32"], 768),
    "ppo, Box actions": ("pendulum", ["trainer.num_envs=8", "trainer.rollout_len=50"], 1200),
    "ppo, per-agent done, two policies": ("tag_continuous", TAG + [
        "trainer.num_envs=4", "trainer.rollout_len=50"], 600),
    "sac": ("pendulum", ["trainer.algorithm=sac"] + OFF_POLICY, 256),
    "td3": ("pendulum", ["trainer.algorithm=td3"] + OFF_POLICY, 256),
    "ddpg": ("pendulum", ["trainer.algorithm=ddpg"] + OFF_POLICY, 256),
    "ppo population": ("cartpole", ["trainer.population=2", "trainer.num_envs=8",
                                     "trainer.rollout_len=32"], 768),
    "a2c population (central critic)": ("tag_gridworld", [
        "trainer.population=2", "trainer.algorithm=a2c", "trainer.update_epochs=1",
        "trainer.num_minibatches=1", "policy.critic=central", "trainer.num_envs=8",
        "trainer.rollout_len=32"], 768),
    "ppo population, Box actions": ("pendulum", ["trainer.population=2", "trainer.num_envs=8",
                                                 "trainer.rollout_len=50"], 1200),
    "ppo population, per-agent done": ("tag_continuous", TAG + [
        "trainer.population=2", "trainer.num_envs=4", "trainer.rollout_len=50"], 600),
    "sac population": ("pendulum", ["trainer.algorithm=sac", "trainer.population=2"]
                       + OFF_POLICY, 256),
    "td3 population": ("pendulum", ["trainer.algorithm=td3", "trainer.population=2"]
                       + OFF_POLICY, 256),
    "ddpg population": ("pendulum", ["trainer.algorithm=ddpg", "trainer.population=2"]
                        + OFF_POLICY, 256),
    # the recipe's own size through --num_envs: the replica rule changes nothing at k = 1
    "cartpole recipe, --num_envs 32": ("cartpole", ["--num_envs=32"], 4096),
    "tag recipe, --num_envs 16": ("tag_continuous", ["--num_envs=16"], 1024),
    # a snapshot every update into pools of 2: by the 4th iteration each pool has evicted
    "ppo league": ("tag_continuous", TAG + [
        "trainer.league=true", "trainer.league_snapshot_every=1", "trainer.league_capacity=2",
        "trainer.num_envs=8", "trainer.rollout_len=50"], 1600),
}
SKIPPED = ("time", "env_steps_per_s", "time_share")


def run_case(env: str, sets: list, steps: int, folder: Path) -> list:
    out_dir = folder / "runs"
    out_dir.mkdir()
    command = [sys.executable, "-m", "gpusim.train", "--env", env, "--backend", "cpu",
               "--seed", "3", "--total_steps", str(steps), "--results_dir", str(out_dir),
               "--quiet", "--set", "trainer.torch_threads=1", "--set", "trainer.compile=off",
               "--set", "trainer.target_return=null", "--set", "trainer.anneal_lr=false",
               "--set", "trainer.final_eval_episodes=0"]
    for item in sets:  # a flag as typed ("--num_envs=32"), else a config key
        command += item.split("=", 1) if item.startswith("--") else ["--set", item]
    # run from an empty folder: `-m gpusim.train` then imports the gpusim of this python's
    # install, not one in the working folder (this checkout's, when the other's python runs)
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    if done.returncode != 0:  # kept as the case's result: `compare` names it
        return [{"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1]}"}]
    (run_dir,) = out_dir.iterdir()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def run(out: Path, only: list):
    results = {}
    for name, (env, sets, steps) in CASES.items():
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as folder:
            results[name] = run_case(env, sets, steps, Path(folder))
        print(f"{name}: {len(results[name])} iterations", flush=True)
    out.write_text(json.dumps(results, indent=1))


def differences(old: list, new: list) -> tuple:
    """(largest relative difference, bitwise equal, keys compared, first key off 1e-6)."""
    worst, equal, compared, first = 0.0, len(old) == len(new), 0, None
    for run in (old, new):
        if run and "error" in run[0]:
            return math.inf, False, 0, run[0]["error"]
    for a, b in zip(old, new):
        for key, value in a.items():
            if key.startswith(SKIPPED) or not isinstance(value, (int, float)):
                continue
            other = b.get(key)
            compared += 1
            if other is None or (isinstance(other, float) and math.isnan(other)):
                equal, worst = False, math.inf
                first = first or key
                continue
            if value != other:
                equal = False
                rel = abs(value - other) / max(abs(value), 1e-3)
                worst = max(worst, rel)
                if rel > 1e-6 and first is None:
                    first = f"{key} (iteration {a.get('iteration')})"
    return worst, equal, compared, first


def compare(old_path: Path, new_path: Path) -> int:
    old, new = json.loads(old_path.read_text()), json.loads(new_path.read_text())
    print(f"| case | iterations | values | bitwise | largest relative difference |")
    print("|---|---:|---:|---|---:|")
    failed = 0
    for name in old:
        if name not in new:
            continue
        worst, equal, compared, first = differences(old[name], new[name])
        failed += worst > 1e-6
        note = f" (first off: {first})" if first else ""
        print(f"| {name} | {len(old[name])} | {compared} | {'yes' if equal else 'no'} | "
              f"{worst:.2e}{note} |")
    print()
    print("| population (m0) against its solo run | old | new |")
    print("|---|---:|---:|")
    for population, lone in MEMBER_OF.items():
        if population in old and population in new:
            print(f"| {population} | {member_gap(old[population], old[lone]):.2e} | "
                  f"{member_gap(new[population], new[lone]):.2e} |")
    return 1 if failed else 0


MEMBER_OF = {"ppo population": "ppo", "ppo population, Box actions": "ppo, Box actions",
             "ppo population, per-agent done": "ppo, per-agent done, two policies",
             "sac population": "sac", "td3 population": "td3", "ddpg population": "ddpg"}


def member_gap(population: list, lone: list) -> float:
    """The largest relative difference between member m0's figures and the solo run's."""
    worst = 0.0
    for a, b in zip(population, lone):
        for key, value in b.items():
            mine = a.get(f"{key}/m0")
            if key.startswith(SKIPPED) or not isinstance(value, float) or mine is None:
                continue
            worst = max(worst, abs(mine - value) / max(abs(value), 1e-3))
    return worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", nargs="*", default=[])
    c = sub.add_parser("compare")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.out, args.only)
        return 0
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
