"""tanh against 2 sigmoid(2x) - 1 on the CPU: the measurements behind the thresholds in
gpusim.training.models (SIGMOID_TANH_MIN_ELEMENTS and its autograd twin).

    python -m benchmarks.calibrations.activations
    python -m benchmarks.calibrations.activations --rounds 9 --width 256

Rows: the policies' MLP shape (4 inputs, two hidden layers of `--width`,
gpusim's MLP) at several row counts, one thread; a no-grad forward (acting)
and a forward and backward (training), with torch's tanh and with the
sigmoid form forced. Each row alternates the two `--rounds` times in one
process and prints the best time of each and their ratio.
"""
from __future__ import annotations

import argparse
import time

import gpusim  # noqa: F401  (gpusim's thread defaults before torch runs)
import torch

from gpusim.training import models

from benchmarks.common import machine

ROWS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
NEVER, ALWAYS = 1 << 62, 0


def best_us(fn, repeat: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e6


def timed(mlp, x, grad: bool, threshold: int, repeat: int) -> float:
    models.SIGMOID_TANH_MIN_ELEMENTS = models.SIGMOID_TANH_MIN_ELEMENTS_GRAD = threshold
    if grad:
        return best_us(lambda: mlp(x).sum().backward(), repeat)
    with torch.no_grad():
        return best_us(lambda: mlp(x), repeat)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(machine())
    print(f"one thread; MLP 4 -> {args.width} -> {args.width} -> 2, tanh; best of "
          f"{args.rounds} rounds\n")
    print("| rows | elements per tanh | pass | tanh (us) | sigmoid form (us) | tanh / sigmoid |")
    print("|---:|---:|---|---:|---:|---:|")
    mlp = models.mlp([4, args.width, args.width, 2], "tanh", 0.01)
    for rows in ROWS:
        x = torch.randn(rows, 4)
        repeat = max(20, 20000 // rows)
        for grad in (False, True):
            times = {NEVER: [], ALWAYS: []}
            for _ in range(args.rounds):
                for threshold in times:
                    times[threshold].append(timed(mlp, x, grad, threshold, repeat))
            tanh, sigmoid = min(times[NEVER]), min(times[ALWAYS])
            print(f"| {rows} | {rows * args.width:,} | {'forward+backward' if grad else 'no-grad forward'} "
                  f"| {tanh:,.0f} | {sigmoid:,.0f} | {tanh / sigmoid:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
