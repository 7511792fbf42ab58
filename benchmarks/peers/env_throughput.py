"""Env throughput of tag_continuous on every available backend, with the NumPy reference.

    python -m benchmarks.peers.env_throughput           # full table
    python -m benchmarks.peers.env_throughput --quick   # fewer replica counts

Random actions (a pool drawn up front), auto-reset on, and replicas spread
over the episode (random start timesteps) so resets happen at their
steady-state rate. Prints the machine, then one row per
(config, backend, replicas): env-steps/s, agent-steps/s, and the speed-up
over the NumPy reference measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import gpusim
from benchmarks.common import machine
from gpusim.backends import cuda_works
from gpusim.envs.tag_continuous import reference

CONFIGS = {"5+100": dict(num_taggers=5, num_runners=100),
           "10+100": dict(num_taggers=10, num_runners=100)}
REPLICAS = (1, 4, 16, 64, 256, 1024, 4096)
QUICK_REPLICAS = (1, 64, 256, 1024)


def action_pool(env, size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.stack([torch.randint(0, n, (env.num_envs, env.num_agents), generator=gen)
                         for n in env.action_nvec], -1).to(torch.int32).to(env.device)
            for _ in range(size)]


def spread_over_episode(env, seed=0):
    state = env.get_state()
    gen = torch.Generator().manual_seed(seed)
    state["timestep"] = torch.randint(0, env.config.episode_length, (env.num_envs,),
                                      generator=gen, dtype=torch.int32).to(env.device)
    env.set_state({"timestep": state["timestep"]})


def measure_env(config, backend, num_envs, min_seconds, max_steps):
    env = gpusim.make("tag_continuous", num_envs=num_envs, backend=backend, seed=0, **config)
    env.reset()
    spread_over_episode(env)
    pool = action_pool(env)
    for k in range(3):  # warm-up (compilation happened on the first call)
        env.step(pool[k % len(pool)])
    env.backend.synchronize()
    steps, start = 0, time.perf_counter()
    while steps < max_steps:
        env.step(pool[steps % len(pool)])
        steps += 1
        if steps % 8 == 0 or steps == max_steps:
            env.backend.synchronize()
            if time.perf_counter() - start >= min_seconds:
                break
    env.backend.synchronize()
    elapsed = time.perf_counter() - start
    return steps * num_envs / elapsed, env.num_agents


def cuda_c_available() -> list:
    """["cuda_c"] where the CUDA C backend can be built here (a compiler and a driver), else []."""
    try:
        gpusim.get_backend("cuda_c")
    except gpusim.BackendError as exc:
        print(f"cuda_c: skipped ({exc})")
        return []
    return ["cuda_c"]


def measure_reference(config, num_envs, steps):
    env = gpusim.make("tag_continuous", num_envs=num_envs, backend="cpu", seed=0, **config)
    env.reset()
    state = {k: v.numpy() for k, v in env.get_state().items()}
    pool = [a.numpy() for a in action_pool(env, size=steps)]
    start = time.perf_counter()
    for k in range(steps):
        state = reference.step(env.config, state, pool[k])[0]
    return steps * num_envs / (time.perf_counter() - start)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=None,
                        help="default: cpu, numba and cuda_c where a GPU works, cudasim "
                             "(1 replica)")
    parser.add_argument("--replicas", nargs="+", type=int, default=None)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--quick", action="store_true", help="fewer replica counts")
    parser.add_argument("--seconds", type=float, default=1.5, help="minimum timing per row")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)

    backends = args.backends or (["cpu"] + (["numba", *cuda_c_available()]
                                            if cuda_works()[0] else []) + ["cudasim"])
    replicas = args.replicas or (QUICK_REPLICAS if args.quick else REPLICAS)
    print(machine())
    print(f"tag_continuous, K=10, random actions, auto-reset on; min {args.seconds}s per row\n")
    header = f"{'config':7} {'backend':8} {'replicas':>8} {'env-steps/s':>13} " \
             f"{'agent-steps/s':>14} {'x numpy':>9}"
    print(header)
    print("-" * len(header))
    rows = []
    for name in args.configs:
        config = CONFIGS[name]
        ref_env_steps = measure_reference(config, num_envs=1, steps=10)
        entries = [("numpy-ref", 1, ref_env_steps, config["num_taggers"] + config["num_runners"])]
        for backend in backends:
            # the simulator interprets every thread in Python: one replica is plenty
            counts = [1] if backend == "cudasim" else replicas
            for num_envs in counts:
                max_steps = 3 if backend == "cudasim" else 100_000
                env_steps, agents = measure_env(config, backend, num_envs, args.seconds, max_steps)
                entries.append((backend, num_envs, env_steps, agents))
        for backend, num_envs, env_steps, agents in entries:
            row = dict(config=name, backend=backend, replicas=num_envs,
                       env_steps_per_s=env_steps, agent_steps_per_s=env_steps * agents,
                       speedup_vs_numpy=env_steps / ref_env_steps)
            rows.append(row)
            print(f"{name:7} {backend:8} {num_envs:>8} {env_steps:>13,.0f} "
                  f"{env_steps * agents:>14,.0f} {row['speedup_vs_numpy']:>9,.0f}")
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
