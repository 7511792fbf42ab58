"""Does the learner's one private torch API pay? Its Adam step against torch's public ones.

    python -m benchmarks.calibrations.private_apis

gpusim's `Adam` (training/speed/descent.py) clips with `torch._foreach_norm` and
`torch._foreach_mul_`, steps with `torch._fused_adam_` (the kernel `torch.optim.Adam(...,
fused=True)` runs) and zeroes with `torch._foreach_zero_`. The public ways to take the
same step are `torch.nn.utils.clip_grad_norm_` with `torch.optim.adam.adam(...,
fused=True)` (the functional form) or with `torch.optim.Adam(..., fused=True)`. Each
is timed (one thread, the best of 5 rounds of 1,000 steps) on the networks of
cartpole's recipe ([64, 64]) and of tag_continuous's ([256, 256]), and checked to give
the same parameters to the bit after 10 steps. Then one solo cartpole PPO iteration of
the recipe's size (32 replicas x 64 steps, 4 epochs x 4 minibatches: 16 steps) is
timed with each, to put the difference beside what an iteration costs.
"""
from __future__ import annotations

import time

import torch
from torch.optim.adam import adam as functional_adam

from benchmarks.common import machine

ROUNDS, STEPS = 5, 1000


def variants(model_a, model_b, model_c, grads):
    from gpusim.training.speed.descent import Adam
    ours = Adam(list(model_a.parameters()), 1e-3, eps=1e-5, max_grad_norm=0.5)

    def private():
        for p, g in zip(ours.params, grads):
            p.grad.copy_(g)
        ours.step()
        ours.zero_grad()

    params_b = list(model_b.parameters())
    state = [[torch.zeros_like(p) for p in params_b] for _ in range(2)]
    steps = [torch.zeros(()) for _ in params_b]
    for p in params_b:
        p.grad = torch.zeros_like(p)

    def functional():
        for p, g in zip(params_b, grads):
            p.grad.copy_(g)
        torch.nn.utils.clip_grad_norm_(params_b, 0.5, foreach=True)
        with torch.no_grad():
            functional_adam(params_b, [p.grad for p in params_b], state[0], state[1], [], steps,
                            fused=True, amsgrad=False, beta1=0.9, beta2=0.999, lr=1e-3,
                            weight_decay=0.0, eps=1e-5, maximize=False)
        for p in params_b:
            p.grad.zero_()

    params_c = list(model_c.parameters())
    for p in params_c:
        p.grad = torch.zeros_like(p)
    optimizer = torch.optim.Adam(params_c, lr=1e-3, eps=1e-5, fused=True)

    def optim():
        for p, g in zip(params_c, grads):
            p.grad.copy_(g)
        torch.nn.utils.clip_grad_norm_(params_c, 0.5, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    return {"gpusim Adam (private)": private,
            "clip_grad_norm_ + optim.adam.adam(fused)": functional,
            "clip_grad_norm_ + optim.Adam(fused)": optim}


def best_of(step) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        best = min(best, (time.perf_counter() - start) / STEPS)
    return best


def iteration_ms() -> float:
    """One solo cartpole PPO iteration of the recipe's size, median of 20, after 3."""
    from gpusim.envs import env_class
    from gpusim.training.run_config import load_run_config
    from gpusim.training.loop import Trainer
    cls = env_class("cartpole")
    config = load_run_config("cartpole", cls, sets=[
        "trainer.backend=cpu", "trainer.torch_threads=1", "trainer.compile=off",
        "trainer.total_steps=100000000", "trainer.target_return=null"])
    trainer = Trainer(config, cls)
    for _ in range(3):
        trainer.iterate(1e-3)
    times = []
    for _ in range(20):
        start = time.perf_counter()
        trainer.iterate(1e-3)
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def main():
    from gpusim.training.models import ActorCritic
    torch.set_num_threads(1)
    print(machine())
    print("| network | way | us per step | bitwise as gpusim's |")
    print("|---|---|---:|---|")
    per_step = {}
    for obs, hidden in ((4, (64, 64)), (30, (256, 256))):
        models = [ActorCritic(obs, (21, 21), hidden) for _ in range(3)]
        for m in models[1:]:
            m.load_state_dict(models[0].state_dict())
        grads = [torch.randn_like(p) for p in models[0].parameters()]
        ways = variants(*models, grads)
        for step in ways.values():
            for _ in range(10):
                step()
        first = list(models[0].parameters())
        alike = [all(torch.equal(a, b) for a, b in zip(first, model.parameters()))
                 for model in models]  # (before the timing moves them on)
        for (name, step), same in zip(ways.items(), alike):
            per_step[(hidden, name)] = best_of(step)
            print(f"| {list(hidden)} | {name} | {1e6 * per_step[(hidden, name)]:.1f} | "
                  f"{'yes' if same else 'no'} |")
    ms = iteration_ms()
    extra = 16 * (per_step[((64, 64), "clip_grad_norm_ + optim.adam.adam(fused)")]
                  - per_step[((64, 64), "gpusim Adam (private)")]) * 1e3
    print(f"\nA cartpole recipe iteration (16 Adam steps): {ms:.1f} ms with gpusim's Adam; "
          f"the public functional Adam would add {extra:.2f} ms ({100 * extra / ms:.1f}%).")


if __name__ == "__main__":
    main()
