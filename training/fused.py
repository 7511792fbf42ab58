"""A whole optimizer step as one compiled call: gradient, norm clipping and Adam.

Eager PyTorch spends most of a small learner's time between operators:
a PPO minibatch of 512 rows on a 64x64 MLP is a few hundred of them
(forward, autograd's backward, clipping, Adam), each a few microseconds of
dispatch around microseconds of work. `FusedStep` traces one step
(`torch.func.grad` of a loss written over the model's parameters, then
clipping and Adam written as tensor operations) and compiles it with
torch.compile into one graph: matmuls call the BLAS, everything between
them runs in a few generated loops.

The step updates the model's own parameters and the torch Adam's own state
(`exp_avg`, `exp_avg_sq`, `step`) in place, with Adam's arithmetic, so a
checkpoint, an eager step and a fused step are interchangeable. The
learning rate is a tensor (a changing float would recompile). Compiled
code is cached on disk in gpusim's cache folder (inductor's graph cache),
so only a first run compiles. Whatever fails to compile falls back, with
one line, to the caller's eager step.
"""
from __future__ import annotations

import sys

import torch

from gpusim.errors import describe


def adam_state(optimizer: torch.optim.Adam, params: list) -> list:
    """(step, exp_avg, exp_avg_sq) per parameter: the optimizer's own state tensors, made as
    its first step would make them (`step` on the parameter's device, so the fused step
    reads it without a host sync)."""
    out = []
    for p in params:
        state = optimizer.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if state["step"].device != p.device:
            state["step"] = state["step"].to(p.device)
        out.append((state["step"], state["exp_avg"], state["exp_avg_sq"]))
    return out


def clip_and_adam(params: list, grads: list, state: list, lr: torch.Tensor, betas: tuple,
                  eps: float, max_grad_norm: float):
    """`clip_grad_norm_` then one `torch.optim.Adam` step (no weight decay, not amsgrad), in
    place on `params` and their `state`, in torch's own order of operations."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = (max_grad_norm / (total + 1e-6)).clamp(max=1.0)
    beta1, beta2 = betas
    for p, g, (step, exp_avg, exp_avg_sq) in zip(params, grads, state):
        g = g * scale
        step.add_(1)
        exp_avg.lerp_(g, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step_size = lr / (1 - beta1 ** step)
        denom = exp_avg_sq.sqrt() / (1 - beta2 ** step).sqrt() + eps
        p.sub_(step_size * exp_avg / denom)


class FusedStep:
    """`loss_fn(params, *inputs) -> (loss, stats)` minimised by one compiled step of `model`
    under `optimizer` (a torch Adam) with gradient clipping; calling it returns the
    detached `stats`, or None once compiling failed (the caller then steps eagerly)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Adam, loss_fn,
                 max_grad_norm: float, what: str):
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.names = [name for name, p in model.named_parameters() if p.requires_grad]
        self.params = [model.get_parameter(name) for name in self.names]
        group = optimizer.param_groups[0]
        if len(optimizer.param_groups) != 1 or group["weight_decay"] or group["amsgrad"] \
                or group["maximize"]:
            raise ValueError("FusedStep takes a plain Adam over one parameter group")
        self.betas, self.eps = tuple(group["betas"]), group["eps"]
        self.max_grad_norm = max_grad_norm
        self.what = what
        self.lr = torch.zeros((), device=self.params[0].device)
        self.compiled = torch.compile(self._step, dynamic=None)

    def _step(self, params, state, lr, *inputs):
        named = dict(zip(self.names, params))
        grads, stats = torch.func.grad(self.loss_fn, has_aux=True)(named, *inputs)
        clip_and_adam(params, [grads[n] for n in self.names], state, lr, self.betas, self.eps,
                      self.max_grad_norm)
        return stats

    def __call__(self, *inputs):
        """One step at the optimizer's learning rate."""
        if self.compiled is None:
            return None
        self.lr.fill_(self.optimizer.param_groups[0]["lr"])
        params = [p.detach() for p in self.params]  # aliases: updated in place
        try:
            return self.compiled(params, adam_state(self.optimizer, self.params), self.lr,
                                 *inputs)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: step eagerly
            print(f"gpusim: torch.compile of {self.what} failed ({describe(exc)[:200]}); "
                  "running it eagerly", file=sys.stderr, flush=True)
            self.compiled = None
            return None
