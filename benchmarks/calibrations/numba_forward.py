"""A policy's acting forward written in numba loops, against gpusim's torch forward, on the CPU:
the measurement behind not fusing the policy into the env's step kernel on the CPU.

    python -m benchmarks.calibrations.numba_forward
    python -m benchmarks.calibrations.numba_forward --rounds 9

The fused rollout #30 asks for would run the policy's forward and sampling
inside a compiled CPU kernel, next to the env step, instead of torch
operators. This script measures the best such forward one can write in
numba: an actor MLP (tanh hidden layers, categorical head) in plain loops
(each output a dot product the compiler vectorises, `fastmath` reductions),
tanh as a rational function fitted here (numba has no vectorised exp
without Intel's SVML), the log-softmax and an inverse-CDF draw, all in one
call; against the acting call it would replace, `ActorCritic.log_probs` (its
draw, the sampler kernel, is a few us more). Rows: the recipes' batch sizes
for cartpole's MLP (4 -> 64 -> 64 -> 2) and tag_continuous's policy shape
(1,760 agents, 71 -> 64 -> 64 -> 42). One thread, best of `--rounds`, the two
alternated in one process; the last column is the largest difference of a
drawn action's log-probability between the two (the learner recomputes it
with torch, so it must agree to 1e-5).
"""
from __future__ import annotations

import argparse
import math
import time

import gpusim  # noqa: F401  (gpusim's thread defaults before torch runs)
import numba
import numpy as np
import torch

from gpusim.training.models import ActorCritic

from benchmarks.common import machine

# rows, observation size, choices: cartpole's recipe at 5-256 envs; tag_continuous's 1,760
# agents (its two 21-choice components as one 42-choice head)
SHAPES = ((5, 4, 2), (32, 4, 2), (64, 4, 2), (256, 4, 2), (1760, 71, 42))
HIDDEN = 64
TANH_LIMIT = 9.0  # |x| beyond this: tanh is 1 within 3e-8


def fit_tanh(degree: int = 6) -> tuple:
    """(P, Q): tanh(x) ~ x P(x^2) / Q(x^2) on [0, TANH_LIMIT], Q(0) = 1, by linearised least
    squares reweighted toward the largest errors (a few rounds of Lawson's scheme)."""
    x = np.concatenate([np.linspace(0, TANH_LIMIT, 20001), np.linspace(0, 1, 5001)])
    y, z = np.tanh(x), x * x
    weight = np.ones_like(x)
    for _ in range(30):
        columns = np.concatenate([x[:, None] * z[:, None] ** np.arange(degree + 1),
                                  -y[:, None] * z[:, None] ** np.arange(1, degree + 1)], 1)
        coef, *_ = np.linalg.lstsq(columns * weight[:, None], y * weight, rcond=None)
        p, q = coef[:degree + 1], np.concatenate([[1.0], coef[degree + 1:]])
        den = np.polyval(q[::-1], z)
        err = np.abs(x * np.polyval(p[::-1], z) / den - y)
        weight = (1 + 50 * err / err.max()) / np.abs(den)
    return p.astype(np.float32), q.astype(np.float32)


@numba.njit(inline="always")
def _tanh(x, p, q):
    x = min(max(x, np.float32(-TANH_LIMIT)), np.float32(TANH_LIMIT))
    z = x * x
    num, den = p[-1], q[-1]
    for k in range(len(p) - 2, -1, -1):
        num = num * z + p[k]
        den = den * z + q[k]
    return x * num / den


@numba.njit(fastmath={"reassoc", "nsz", "arcp", "contract"})
def _layer(x, weight, bias, out, p, q, activate):
    rows, inputs = x.shape
    for r in range(rows):
        for j in range(weight.shape[0]):
            acc = np.float32(0.0)
            for i in range(inputs):
                acc += x[r, i] * weight[j, i]
            out[r, j] = acc + bias[j]
        if activate:
            for j in range(weight.shape[0]):
                out[r, j] = _tanh(out[r, j], p, q)


@numba.njit
def numba_act(obs, w1, b1, w2, b2, w3, b3, p, q, uniform, h1, h2, logits, actions, log_prob):
    """The actor's forward, log-softmax and an inverse-CDF draw per row, in one call."""
    _layer(obs, w1, b1, h1, p, q, True)
    _layer(h1, w2, b2, h2, p, q, True)
    _layer(h2, w3, b3, logits, p, q, False)
    for r in range(logits.shape[0]):
        top = logits[r, 0]
        for j in range(1, logits.shape[1]):
            top = max(top, logits[r, j])
        total = 0.0
        for j in range(logits.shape[1]):
            total += math.exp(logits[r, j] - top)
        log_total = top + math.log(total)
        cumulative, choice = 0.0, logits.shape[1] - 1
        for j in range(logits.shape[1]):
            cumulative += math.exp(logits[r, j] - log_total)
            if uniform[r] < cumulative:
                choice = j
                break
        actions[r] = choice
        log_prob[r] = logits[r, choice] - log_total


def mean_us(fn, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e6


def measure(rows: int, obs_dim: int, choices: int, p, q, rounds: int) -> tuple:
    torch.manual_seed(rows)
    model = ActorCritic(obs_dim, (choices,), (HIDDEN, HIDDEN))
    with torch.no_grad():  # trained-looking weights: away from the initial near-uniform head
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    obs = torch.randn(rows, 1, obs_dim)
    weights = [t.detach().numpy() for layer in model.actor if hasattr(layer, "weight")
               for t in (layer.weight, layer.bias)]
    flat = obs.view(rows, obs_dim).numpy()
    scratch = [np.zeros((rows, HIDDEN), np.float32), np.zeros((rows, HIDDEN), np.float32),
               np.zeros((rows, choices), np.float32)]
    uniform = np.random.default_rng(rows).random(rows).astype(np.float32)
    actions, log_prob = np.zeros(rows, np.int32), np.zeros(rows, np.float32)

    def numba_call():
        numba_act(flat, *weights, p, q, uniform, *scratch, actions, log_prob)

    def torch_call():
        model.log_probs(obs)

    repeat = max(20, 20000 // rows)
    with torch.no_grad():
        numba_call()
        torch_call()
        numba_us, torch_us = math.inf, math.inf
        for _ in range(rounds):
            numba_us = min(numba_us, mean_us(numba_call, repeat))
            torch_us = min(torch_us, mean_us(torch_call, repeat))
        reference = model.log_probs(obs).view(rows, choices).numpy()
    gap = float(np.abs(reference[np.arange(rows), actions] - log_prob).max())
    return torch_us, numba_us, gap


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    p, q = fit_tanh()
    grid = np.linspace(-12, 12, 200001).astype(np.float32)
    fitted = np.array([_tanh(v, p, q) for v in grid[::100]])
    tanh_error = float(np.abs(fitted - np.tanh(grid[::100].astype(np.float64))).max())
    print(machine())
    print(f"one thread; best of {args.rounds} rounds; fitted tanh: largest error "
          f"{tanh_error:.1e} on [-12, 12]\n")
    print("| rows | MLP | torch log_probs (us) | numba forward and draw (us) | torch / numba "
          "| torch GMAC/s | numba GMAC/s | largest log-prob difference |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for rows, obs_dim, choices in SHAPES:
        torch_us, numba_us, gap = measure(rows, obs_dim, choices, p, q, args.rounds)
        macs = rows * (obs_dim * HIDDEN + HIDDEN * HIDDEN + HIDDEN * choices)
        print(f"| {rows:,} | {obs_dim} -> {HIDDEN} -> {HIDDEN} -> {choices} | {torch_us:,.1f} | "
              f"{numba_us:,.1f} | {torch_us / numba_us:.2f}x | {macs / torch_us / 1e3:.1f} | "
              f"{macs / numba_us / 1e3:.1f} | {gap:.1e} |")


if __name__ == "__main__":
    main()
