"""Env-only throughput of the MPE scenarios: gpusim side by side with JaxMARL, VMAS and mpe2.

    python -m benchmarks.peers.mpe_throughput --setup-peers .venv-peers   # once: the peers' venv
    python -m benchmarks.peers.mpe_throughput --peers .venv-peers         # the table
    python -m benchmarks.peers.mpe_throughput --quick                     # gpusim alone, fewer rows

simple_spread with 3 and 100 agents, simple_tag with mpe2's default (3
adversaries, 1 good agent, 2 obstacles) and with 5 adversaries and 100 good
agents; each library builds the same scenario with the same counts, on the
CPU, discrete actions, random actions drawn up front (a pool of 16), episodes
of 25 steps reset as each library resets (gpusim and JaxMARL inside their
step, VMAS by `reset()` every 25 steps, mpe2 by `reset()` when its agents
are done). Rows: agent-steps/s (env steps x agents / s) per replica count,
and each library's observation sizes, which differ where the library's
observation does (see the scenarios' READMEs).

The peers are never dependencies of gpusim: `--setup-peers DIR` makes a
separate virtualenv (torch==2.13.0 first, so that vmas does not pull CUDA
wheels; then jax[cpu], jaxmarl, vmas, mpe2) and each peer runs in a
subprocess of that venv's Python.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = {  # name -> (scenario, agents, gpusim/mpe2 keys, JaxMARL keys, VMAS keys)
    "spread 3": ("simple_spread", 3, dict(N=3), dict(num_agents=3, num_landmarks=3),
                 dict(n_agents=3)),
    "spread 100": ("simple_spread", 100, dict(N=100), dict(num_agents=100, num_landmarks=100),
                   dict(n_agents=100)),
    "tag 3+1": ("simple_tag", 4, dict(num_adversaries=3, num_good=1, num_obstacles=2),
                dict(num_adversaries=3, num_good_agents=1, num_obs=2),
                dict(num_adversaries=3, num_good_agents=1, num_landmarks=2)),
    "tag 5+100": ("simple_tag", 105, dict(num_adversaries=5, num_good=100, num_obstacles=2),
                  dict(num_adversaries=5, num_good_agents=100, num_obs=2),
                  dict(num_adversaries=5, num_good_agents=100, num_landmarks=2)),
}
REPLICAS = {"spread 3": (1, 64, 1024, 4096), "spread 100": (1, 16, 64, 256),
            "tag 3+1": (1, 64, 1024, 4096), "tag 5+100": (1, 16, 64, 256)}
QUICK = {"spread 3": (64, 1024), "spread 100": (16, 64), "tag 3+1": (64, 1024),
         "tag 5+100": (16, 64)}
EPISODE = 25
POOL = 16
PEER_PACKAGES = ["jax[cpu]", "jaxmarl", "vmas", "mpe2"]


# ---- one library, one config, one replica count: agent-steps/s ----------------------------
def timed(step, min_seconds, max_steps):
    for _ in range(3):  # warm-up: compilation, first-touch
        step()
    steps, start = 0, time.perf_counter()
    while steps < max_steps:
        step()
        steps += 1
        if time.perf_counter() - start >= min_seconds:
            break
    return steps / (time.perf_counter() - start)


def run_gpusim(config, replicas, seconds):
    import torch
    import gpusim
    scenario, agents, keys, _, _ = CONFIGS[config]
    env = gpusim.make(scenario, num_envs=replicas, backend="cpu", seed=0, **keys)
    env.reset()
    gen = torch.Generator().manual_seed(0)
    pool = [{name: torch.randint(0, spec.actions[0], (replicas, spec.num_agents, 1),
                                 generator=gen, dtype=torch.int32)
             for name, spec in env.policy_specs.items()} for _ in range(POOL)]
    count = [0]

    def step():
        env.step(pool[count[0] % POOL])
        count[0] += 1
    rate = timed(step, seconds, 1_000_000)
    sizes = {name: spec.obs_dim for name, spec in env.policy_specs.items()}
    return rate * replicas * agents, sizes


def run_jaxmarl(config, replicas, seconds):
    import jax
    import jax.numpy as jnp
    from jaxmarl import make
    scenario, agents, _, keys, _ = CONFIGS[config]
    env = make(f"MPE_{scenario}_v3", **keys)
    key = jax.random.PRNGKey(0)
    keys_reset = jax.random.split(key, replicas)
    _, state = jax.vmap(env.reset)(keys_reset)
    pool = {a: jax.random.randint(jax.random.PRNGKey(i + 1), (POOL, replicas), 0,
                                  env.action_space(a).n) for i, a in enumerate(env.agents)}
    chunk = 25  # steps per jitted call (a scan), as JaxMARL's training loops run it

    @jax.jit
    def run(state, key, start):
        def body(carry, t):
            state, key = carry
            key, sub = jax.random.split(key)
            actions = {a: pool[a][(start + t) % POOL] for a in env.agents}
            _, state, _, _, _ = jax.vmap(env.step)(jax.random.split(sub, replicas), state,
                                                   actions)
            return (state, key), None
        (state, key), _ = jax.lax.scan(body, (state, key), jnp.arange(chunk))
        return state, key

    carry = [state, key, 0]

    def step():
        carry[0], carry[1] = run(carry[0], carry[1], carry[2])
        jax.block_until_ready(carry[0])
        carry[2] += chunk
    rate = timed(step, seconds, 1_000_000) * chunk
    obs, _ = env.reset(key)
    sizes = {a.rsplit("_", 1)[0]: int(obs[a].shape[0]) for a in env.agents}
    return rate * replicas * agents, sizes


def run_vmas(config, replicas, seconds):
    import torch
    import vmas
    scenario, agents, _, _, keys = CONFIGS[config]
    torch.manual_seed(0)
    env = vmas.make_env(scenario, num_envs=replicas, device="cpu", continuous_actions=False,
                        max_steps=EPISODE, seed=0, **keys)
    obs = env.reset()
    pool = [[torch.randint(0, 5, (replicas,)) for _ in env.agents] for _ in range(POOL)]
    count = [0]

    def step():
        env.step(pool[count[0] % POOL])
        count[0] += 1
        if count[0] % EPISODE == 0:
            env.reset()
    rate = timed(step, seconds, 1_000_000)
    sizes = {a.name.rsplit("_", 1)[0]: int(o.shape[-1]) for a, o in zip(env.agents, obs)}
    return rate * replicas * agents, sizes


def run_mpe2(config, replicas, seconds):
    import importlib
    import numpy as np
    scenario, agents, keys, _, _ = CONFIGS[config]
    env = importlib.import_module(f"mpe2.{scenario}_v3").parallel_env(**keys)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    pool = [{a: int(rng.integers(0, 5)) for a in env.possible_agents} for _ in range(POOL)]
    count = [0]

    def step():
        env.step(pool[count[0] % POOL])
        count[0] += 1
        if not env.agents:
            env.reset()
    rate = timed(step, seconds, 1_000_000)
    sizes = {a.rsplit("_", 1)[0]: int(env.observation_space(a).shape[0])
             for a in env.possible_agents}
    return rate * agents, sizes


RUNNERS = {"gpusim": run_gpusim, "jaxmarl": run_jaxmarl, "vmas": run_vmas, "mpe2": run_mpe2}


def versions(library) -> str:
    from importlib.metadata import version
    names = {"gpusim": ["gpusim", "numba", "torch"], "jaxmarl": ["jaxmarl", "jax"],
             "vmas": ["vmas", "torch"], "mpe2": ["mpe2", "numpy"]}[library]
    return ", ".join(f"{n} {version(n)}" for n in names)


def worker(library, configs, replicas, seconds):
    """Measure in this process; one JSON line per row on stdout."""
    print(json.dumps({"library": library, "versions": versions(library)}), flush=True)
    for config in configs:
        counts = (1,) if library == "mpe2" else replicas[config]
        for count in counts:
            rate, sizes = RUNNERS[library](config, count, seconds)
            print(json.dumps({"library": library, "config": config, "replicas": count,
                              "agent_steps_per_s": rate, "obs": sizes}), flush=True)


# ---- the orchestrator --------------------------------------------------------------------
def run_worker(python, library, args) -> list:
    # by its path, not as a module: a worker imports nothing of this repository's but gpusim
    command = [python, __file__, "--worker", library, "--seconds", str(args.seconds),
               "--configs", *args.configs] + (["--quick"] if args.quick else [])
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        print(f"{library}: failed ({tail[0]})", file=sys.stderr)
    return lines


def setup_peers(directory: str):
    venv = Path(directory)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + ["torch==2.13.0"], check=True)  # first: vmas needs torch
    subprocess.run(pip + PEER_PACKAGES, check=True)
    print(f"peers installed in {venv}: run with --peers {venv}")


def print_table(rows, seconds):
    from benchmarks.common import machine
    print(machine())
    for row in rows:
        if "versions" in row:
            print(f"  {row['library']}: {row['versions']}")
    print(f"CPU, discrete random actions, 25-step episodes, min {seconds}s per row\n")
    header = f"{'config':11} {'library':8} {'replicas':>8} {'agent-steps/s':>14}  obs sizes"
    print(header)
    print("-" * len(header))
    for row in rows:
        if "config" in row:
            sizes = ", ".join(f"{k} {v}" for k, v in row["obs"].items())
            print(f"{row['config']:11} {row['library']:8} {row['replicas']:>8} "
                  f"{row['agent_steps_per_s']:>14,.0f}  {sizes}")
    print("\nbest agent-steps/s per config, gpusim over each peer:")
    best = {}
    for row in rows:
        if "config" in row:
            key = (row["config"], row["library"])
            best[key] = max(best.get(key, 0), row["agent_steps_per_s"])
    for config in dict.fromkeys(c for c, _ in best):
        ours = best.get((config, "gpusim"))
        ratios = [f"x{ours / best[(config, lib)]:,.1f} {lib}" for lib in ("jaxmarl", "vmas", "mpe2")
                  if ours and (config, lib) in best]
        print(f"  {config:11} " + ", ".join(ratios))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", help="the peers' virtualenv (see --setup-peers); without "
                                        "it, gpusim alone")
    parser.add_argument("--setup-peers", metavar="DIR", help="make the peers' virtualenv")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seconds", type=float, default=2.0, help="minimum timing per row")
    parser.add_argument("--quick", action="store_true", help="fewer replica counts")
    parser.add_argument("--worker", choices=list(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    replicas = QUICK if args.quick else REPLICAS
    if args.setup_peers:
        setup_peers(args.setup_peers)
        return
    if args.worker:
        worker(args.worker, args.configs, replicas, args.seconds)
        return
    rows = run_worker(sys.executable, "gpusim", args)
    if args.peers:
        python = str(Path(args.peers) / "bin" / "python")
        for library in ("jaxmarl", "vmas", "mpe2"):
            rows += run_worker(python, library, args)
    print_table(rows, args.seconds)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
