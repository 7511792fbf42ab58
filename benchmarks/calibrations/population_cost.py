"""What a population's mechanism costs: seconds per iteration of this checkout's against
another gpusim's, and against this checkout with every pass under vmap.

    python -m benchmarks.calibrations.population_cost --against OTHER_CHECKOUT [--rounds 5]

OTHER_CHECKOUT is a folder from which `import gpusim` imports another gpusim (a
source tree laid out as installed: `gpusim/` with `envs/` and `training/` inside it).
Each measurement is a fresh process: a population trainer built on the cpu backend
(one torch thread), 3 iterations to warm up, then 10 timed; rounds alternate the
variants, so a busy spell falls on all of them. Workloads, as the learner issue asks:
cartpole's recipe with 8 seeds, and simple_spread MAPPO (central critic) with 2
learning rates x 4 seeds. Variants:

- `this`: this checkout as it is (the solo loss under vmap in the update; acting and
  the critic's passes as one batched product over the stacked networks);
- `this, all vmap`: this checkout with the acting and critic passes under vmap too
  (the actor-critics' `members_lead` off);
- `other`: the other checkout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.common import machine

WORKLOADS = {
    "cartpole x 8 seeds": ("cartpole", ["trainer.population=8"]),
    "simple_spread MAPPO, 2 lr x 4 seeds": ("simple_spread", [
        "policy.critic=central", "trainer.population={lr: [0.0003, 0.001]}",
        "trainer.seeds_per_setting=4"]),
}
CHILD = """
import json, sys, time
import torch
from gpusim.envs import env_class
from gpusim.training import models
from gpusim.training.run_config import load_run_config
from gpusim.training.loop import Trainer
env, sets, all_vmap = json.loads(sys.argv[1])
if all_vmap:
    for cls in (models.ActorCritic, models.GaussianActorCritic):
        cls.members_lead = False
cls = env_class(env)
config = load_run_config(env, cls, sets=sets + [
    "trainer.backend=cpu", "trainer.torch_threads=1", "trainer.total_steps=100000000",
    "trainer.target_return=null"])
trainer = Trainer(config, cls)
for _ in range(3):
    trainer.iterate(config.trainer.lr)
start = time.perf_counter()
for _ in range(10):
    trainer.iterate(config.trainer.lr)
print(json.dumps((time.perf_counter() - start) / 10))
"""


def measure(env: str, sets: list, path: str | None, all_vmap: bool) -> float:
    environ = dict(os.environ)
    if path is not None:
        environ["PYTHONPATH"] = path
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps([env, sets, all_vmap])],
                         check=True, capture_output=True, text=True, env=environ,
                         cwd=path or None)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", required=True, help="another gpusim's import folder")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(machine())
    variants = {"this": (None, False), "this, all vmap": (None, True),
                "other": (args.against, False)}
    print("| workload | variant | ms per iteration, min | median | median / other's |")
    print("|---|---|---:|---:|---:|")
    for workload, (env, sets) in WORKLOADS.items():
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (path, all_vmap) in variants.items():
                times[name].append(measure(env, sets, path, all_vmap))
        other = statistics.median(times["other"])
        for name, values in times.items():
            median = statistics.median(values)
            print(f"| {workload} | {name} | {1e3 * min(values):.1f} | {1e3 * median:.1f} | "
                  f"{median / other:.2f} |")


if __name__ == "__main__":
    main()
