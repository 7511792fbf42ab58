"""Candidate rules for what follows the replica count, measured in env steps to the score.

    python -m benchmarks.calibrations.replica_rule                   # every candidate (about 2 h on 2 cores)
    python -m benchmarks.calibrations.replica_rule --only cartpole   # the candidates of one recipe
    python -m benchmarks.calibrations.replica_rule --report          # the table of a saved run

Each candidate is the recipe with its sizes and learning settings set by hand (`--set`
keys) at k x the recipe's replicas, trained in this process over seeds, each stopped at
the recipe's score or at 3x the recipe's env steps (the same cap, so the same
learning-rate schedule where the recipe anneals it, for every candidate): a run that
misses is censored at the cap, never dropped. The rule chosen from this table lives in
training/replicas.py; benchmarks/learning/time_to_score.py measures it as a user types it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks.common import machine

# recipe -> (env, settings every candidate shares, the recipe's total_steps, candidates:
# label -> settings)
SPREAD = ["policy.critic=central", "trainer.target_return=-19"]
CANDIDATES = {
    "cartpole": ("cartpole", [], 499_712, {
        "k=1/4: the recipe's rollout, 1 minibatch": ["trainer.num_envs=8",
                                                     "trainer.num_minibatches=1"],
        "k=1: the recipe (32 x 64, 4 minibatches)": [],
        "k=4: rollout 16, the recipe's batch": ["trainer.num_envs=128", "trainer.rollout_len=16"],
        "k=16: rollout 4, the recipe's batch": ["trainer.num_envs=512", "trainer.rollout_len=4"],
        "k=16: rollout 8, 8 minibatches of the recipe's": ["trainer.num_envs=512",
                                                           "trainer.rollout_len=8",
                                                           "trainer.num_minibatches=8"],
        "k=16: rollout 16, 16 minibatches": ["trainer.num_envs=512", "trainer.rollout_len=16",
                                             "trainer.num_minibatches=16"],
        "k=16: rollout 16, 4 minibatches of 4x, lr x2": ["trainer.num_envs=512",
                                                         "trainer.rollout_len=16",
                                                         "trainer.lr=0.002"],
        "k=16: rollout 8, 4 minibatches of 2x, lr x1.4": ["trainer.num_envs=512",
                                                          "trainer.rollout_len=8",
                                                          "trainer.lr=0.0014"],
        "k=16: rollout 64, 4 minibatches of 16x (the old rule)": ["trainer.num_envs=512"],
        "k=64: rollout 1, the recipe's batch": ["trainer.num_envs=2048", "trainer.rollout_len=1"],
        "k=64: rollout 2, 8 minibatches": ["trainer.num_envs=2048", "trainer.rollout_len=2",
                                           "trainer.num_minibatches=8"],
        "k=64: rollout 4, 16 minibatches": ["trainer.num_envs=2048", "trainer.rollout_len=4",
                                            "trainer.num_minibatches=16"],
        "k=64: rollout 8, 32 minibatches": ["trainer.num_envs=2048", "trainer.rollout_len=8",
                                            "trainer.num_minibatches=32"],
    }),
    "simple_spread": ("simple_spread", SPREAD, 1_000_000, {
        "k=1: the recipe (64 x 25, whole episodes, 4 minibatches)": [],
        "k=4: rollout 6, the recipe's batch": ["trainer.num_envs=256", "trainer.rollout_len=6"],
        "k=4: rollout 8, 5 minibatches": ["trainer.num_envs=256", "trainer.rollout_len=8",
                                          "trainer.num_minibatches=5"],
        "k=4: whole episodes, 16 minibatches": ["trainer.num_envs=256",
                                                "trainer.num_minibatches=16"],
        "k=4: whole episodes, 4 minibatches of 4x (the old rule)": ["trainer.num_envs=256"],
        "k=4: whole episodes, 4 minibatches of 4x, lr x2": ["trainer.num_envs=256",
                                                            "trainer.lr=0.002"],
        "k=16: rollout 8, 20 minibatches": ["trainer.num_envs=1024", "trainer.rollout_len=8",
                                            "trainer.num_minibatches=20"],
        "k=16: whole episodes, 64 minibatches": ["trainer.num_envs=1024",
                                                 "trainer.num_minibatches=64"],
    }),
    "pendulum": ("pendulum", [], 998_400, {
        "k=1: the recipe (64 x 200, whole episodes, 8 minibatches)": [],
        "k=4: whole episodes, 32 minibatches": ["trainer.num_envs=256",
                                                "trainer.num_minibatches=32"],
        "k=4: rollout 50, the recipe's batch": ["trainer.num_envs=256",
                                                "trainer.rollout_len=50"],
    }),
}
SEEDS = {"cartpole": 5, "simple_spread": 5, "pendulum": 3}
CAP = 3


def run(env: str, sets: list, seed: int, cap: int) -> dict:
    from gpusim.envs import env_class
    from gpusim.training.run_config import load_run_config
    from gpusim.training.loop import Trainer
    cls = env_class(env)
    config = load_run_config(env, cls, sets=list(sets) + [
        f"trainer.seed={seed}", f"trainer.total_steps={cap}", "trainer.final_eval_episodes=0",
        "trainer.checkpoint_every=1000000"])
    start = time.perf_counter()
    summary = Trainer(config, cls).train()
    return {"reached": summary["solved"], "env_steps": summary["env_steps"],
            "train_s": round(time.perf_counter() - start, 1)}


def report(results: list):
    print("| recipe | candidate | seeds reaching the score | env steps: median [range] "
          "| x the recipe's median |")
    print("|---|---|---:|---|---:|")
    for recipe in CANDIDATES:
        base = [r["env_steps"] for r in results if r["recipe"] == recipe and "k=1:" in r["label"]]
        base = statistics.median(base) if base else None
        for label in CANDIDATES[recipe][3]:
            runs = [r for r in results if r["recipe"] == recipe and r["label"] == label]
            if not runs:
                continue
            steps = sorted(r["env_steps"] for r in runs)
            hits = sum(r["reached"] for r in runs)
            mark = ">" if 2 * hits <= len(runs) else ""
            median = statistics.median(steps)
            ratio = f"{mark}{median / base:.2f}" if base else "-"
            print(f"| {recipe} | {label} | {hits}/{len(runs)} | {mark}{median:,.0f} "
                  f"[{steps[0]:,}, {steps[-1]:,}] | {ratio} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=tuple(CANDIDATES), default=tuple(CANDIDATES))
    parser.add_argument("--out", default="replica_rule.json")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    path = Path(args.out)
    results = json.loads(path.read_text()) if path.exists() else []
    if not args.report:
        print(machine(), flush=True)
        for recipe in args.only:
            env, shared, total, candidates = CANDIDATES[recipe]
            for label, sets in candidates.items():
                for seed in range(SEEDS[recipe]):
                    if any(r["recipe"] == recipe and r["label"] == label and r["seed"] == seed
                           for r in results):
                        continue
                    row = {"recipe": recipe, "label": label, "seed": seed,
                           **run(env, shared + sets, seed, CAP * total)}
                    print(json.dumps(row), flush=True)
                    results.append(row)
                    path.write_text(json.dumps(results, indent=1))
    report(results)


if __name__ == "__main__":
    main()
