"""Where a second CPU thread pays: the measurements behind gpusim.scale.threads's thresholds.

    python -m benchmarks.calibrations.threads   # every row, 1 thread against all cores
    python -m benchmarks.calibrations.threads --part mlp --rounds 9

Rows:
- mlp: a policy-shaped MLP (16 inputs, two hidden layers of the given width,
  tanh), a no-grad forward (acting) and a forward, backward and Adam step
  (training), at the given rows;
- env: one env step kernel launch at the given replicas.
Each row alternates 1 thread and N threads `--rounds` times in one process
and prints the best and the median time of each, and the gain (best over
best: the closest to quiet cores a shared machine gives). Threads wait as
gpusim sets them (OMP_WAIT_POLICY=PASSIVE, set by importing gpusim first).
"""
from __future__ import annotations

import argparse
import statistics
import time

import gpusim  # first: the OpenMP waiting default before torch loads  # noqa: F401
import numba
import torch

from benchmarks.common import machine

MLP_ROWS = ((64, 32), (64, 512), (64, 1600), (64, 6400), (64, 25600), (256, 256),
            (256, 1024), (256, 4096), (256, 16384), (512, 256), (512, 1024), (512, 4096),
            (1024, 1024))
ENV_ROWS = (("cartpole", 32), ("cartpole", 16384), ("pendulum", 64), ("tag_gridworld", 1024),
            ("tag_continuous", 4), ("tag_continuous", 16), ("tag_continuous", 64))


def mlp_call(width: int, rows: int, train: bool):
    net = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.Tanh(),
                              torch.nn.Linear(width, width), torch.nn.Tanh(),
                              torch.nn.Linear(width, 3))
    opt = torch.optim.Adam(net.parameters())
    x = torch.randn(rows, 16)

    def call():
        if not train:
            with torch.no_grad():
                net(x)
            return
        loss = net(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return call, lambda n: torch.set_num_threads(n)


def env_call(name: str, replicas: int):
    """(a step of `replicas` replicas of `name`, its thread setter, observation values it
    writes)."""
    env = gpusim.make(name, num_envs=replicas, backend="cpu", seed=0)
    env.reset()
    env.step()  # actions already in place: zeros
    values = replicas * env.num_agents * env.obs_dim
    return lambda: env.step(), lambda n: numba.set_num_threads(n), values


def compare(call, set_threads, threads: int, rounds: int, seconds: float) -> dict:
    """Best and median seconds per call with 1 and with `threads` threads, alternated."""
    set_threads(1)
    call()
    start = time.perf_counter()
    call()
    reps = max(3, int(seconds / max(time.perf_counter() - start, 1e-6)))
    times = {1: [], threads: []}
    for _ in range(rounds):
        for n in times:
            set_threads(n)
            call()
            start = time.perf_counter()
            for _ in range(reps):
                call()
            times[n].append((time.perf_counter() - start) / reps)
    set_threads(1)
    return {n: (min(v), statistics.median(v)) for n, v in times.items()}


def row(label: str, result: dict, threads: int):
    (b1, m1), (bn, mn) = result[1], result[threads]
    print(f"| {label} | {b1 * 1e6:,.0f} | {bn * 1e6:,.0f} | {b1 / bn:.2f} | "
          f"{m1 * 1e6:,.0f} | {mn * 1e6:,.0f} | {m1 / mn:.2f} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("mlp", "env", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.05, help="per timed batch of calls")
    args = parser.parse_args(argv)
    threads = min(gpusim.cpu_threads.usable_cores(), numba.config.NUMBA_NUM_THREADS)
    print(machine())
    print(f"1 thread against {threads}; best and median of {args.rounds} alternated rounds, "
          f"microseconds per call")
    print(f"\n| call | best 1 | best {threads} | gain | median 1 | median {threads} | gain |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    if args.part in ("mlp", "all"):
        for width, rows in MLP_ROWS:
            for train in (False, True):
                label = (f"mlp {width} wide, {rows} rows, {'train' if train else 'act'} "
                         f"({rows * width * width / 2 ** 20:,.1f} Mi multiply-adds a layer)")
                row(label, compare(*mlp_call(width, rows, train), threads, args.rounds,
                                   args.seconds), threads)
    if args.part in ("env", "all"):
        for name, replicas in ENV_ROWS:
            call, set_threads, values = env_call(name, replicas)
            row(f"env step {name}, {replicas} replicas ({values:,} observation values)",
                compare(call, set_threads, threads, args.rounds, args.seconds), threads)


if __name__ == "__main__":
    main()
