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
import time

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
    """`clip_grad_norm_` (unless `max_grad_norm` is 0) then one `torch.optim.Adam` step (no
    weight decay, not amsgrad), in place on `params` and their `state`, in torch's own
    order of operations."""
    if max_grad_norm:
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g)
                                                      for g in grads]))
        scale = (max_grad_norm / (total + 1e-6)).clamp(max=1.0)
        grads = [g * scale for g in grads]
    beta1, beta2 = betas
    for p, g, (step, exp_avg, exp_avg_sq) in zip(params, grads, state):
        step.add_(1)
        exp_avg.lerp_(g, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step_size = lr / (1 - beta1 ** step)
        denom = exp_avg_sq.sqrt() / (1 - beta2 ** step).sqrt() + eps
        p.sub_(step_size * exp_avg / denom)


class Descent:
    """Inside a fused step: the parameters of each of its optimizers (aliases of the
    module's own tensors) and `step(name, loss_fn)`, one clipped Adam step of them."""

    def __init__(self, fused: "FusedStep", params: dict, state: dict, lr: dict):
        self.fused, self.tensors, self.state, self.lr = fused, params, state, lr

    def params(self, name: str) -> dict:
        """Optimizer `name`'s parameters by their names in the module it was given."""
        return dict(zip(self.fused.names[name], self.tensors[name]))

    def step(self, name: str, loss_fn, *args):
        """Minimise `loss_fn(params, *args) -> (loss, aux)` by one step of optimizer `name`;
        returns `aux` (computed before the step)."""
        fused = self.fused
        grads, aux = torch.func.grad(loss_fn, has_aux=True)(self.params(name), *args)
        clip_and_adam(self.tensors[name], [grads[n] for n in fused.names[name]],
                      self.state[name], self.lr[name], fused.betas[name], fused.eps[name],
                      fused.max_grad_norm)
        return aux


class EagerDescent:
    """The same interface run eagerly on the modules' own parameters (autograd, then the
    optimizer's own step): what a fused step falls back to, and its reference.
    `reduce(grads)` may sum gradients across ranks in place before clipping."""

    def __init__(self, optimizers: dict, max_grad_norm: float, reduce=None):
        self.optimizers, self.max_grad_norm, self.reduce = optimizers, max_grad_norm, reduce

    def params(self, name: str) -> dict:
        return {n: p for n, p in self.optimizers[name][0].items() if p.requires_grad}

    def step(self, name: str, loss_fn, *args):
        params = self.params(name)
        optimizer = self.optimizers[name][1]
        loss, aux = loss_fn(params, *args)
        grads = torch.autograd.grad(loss, list(params.values()))  # only these weights' grads
        if self.reduce is not None:
            self.reduce(grads)
        for p, g in zip(params.values(), grads):
            p.grad = g
        if self.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(list(params.values()), self.max_grad_norm)
        optimizer.step()
        return aux


class FusedStep:
    """`body(descent, *inputs)`, which takes steps through `descent.step`, as one compiled
    call over the parameters of `optimizers` (name -> (its parameters by name, its torch
    Adam)); calling it returns what `body` returns, or None once compiling failed (the
    caller then steps eagerly)."""

    def __init__(self, optimizers: dict, body, max_grad_norm: float, what: str,
                 dynamic: bool = False):
        """`max_grad_norm`: 0 clips nothing. `dynamic`: the inputs' sizes change from call to
        call (one graph for every size, rather than a recompile per size)."""
        self.body, self.max_grad_norm, self.what = body, max_grad_norm, what
        self.optimizers, self.names, self.params, self.betas, self.eps = {}, {}, {}, {}, {}
        for name, (named_params, optimizer) in optimizers.items():
            group = optimizer.param_groups[0]
            if len(optimizer.param_groups) != 1 or group["weight_decay"] or group["amsgrad"] \
                    or group["maximize"]:
                raise ValueError("FusedStep takes plain Adams over one parameter group each")
            named = [(n, p) for n, p in named_params.items() if p.requires_grad]
            self.optimizers[name] = optimizer
            self.names[name] = [n for n, _ in named]
            self.params[name] = [p for _, p in named]
            self.betas[name], self.eps[name] = tuple(group["betas"]), group["eps"]
        # detached aliases of the parameters (loading a checkpoint copies into the same
        # tensors): the compiled step updates them in place
        self.aliases = {name: [p.detach() for p in ps] for name, ps in self.params.items()}
        device = next(iter(self.params.values()))[0].device
        self.lr = {name: torch.zeros((), device=device) for name in optimizers}
        self.compiled = torch.compile(self._step, dynamic=dynamic or None)
        self.compiled_once = False  # the first call compiles (or loads from the disk cache)

    def _step(self, params, state, lr, *inputs):
        return self.body(Descent(self, params, state, lr), *inputs)

    def __call__(self, *inputs):
        """One call at the optimizers' learning rates."""
        if self.compiled is None:
            return None
        for name, optimizer in self.optimizers.items():
            self.lr[name].fill_(optimizer.param_groups[0]["lr"])
        state = {name: adam_state(self.optimizers[name], ps) for name, ps in self.params.items()}
        try:
            if not self.compiled_once:  # say so, as a log shows kernels' compiles
                return self._first_call(state, inputs)
            return self.compiled(self.aliases, state, self.lr, *inputs)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: step eagerly
            print(f"gpusim: torch.compile of {self.what} failed ({describe(exc)[:200]}); "
                  "running it eagerly", file=sys.stderr, flush=True)
            self.compiled = None
            return None

    def _first_call(self, state, inputs):
        print(f"gpusim: compiling {self.what} with torch.compile (later runs load most of it "
              "from the disk cache)", file=sys.stderr, flush=True)
        start = time.perf_counter()
        out = self.compiled(self.aliases, state, self.lr, *inputs)
        self.compiled_once = True
        print(f"gpusim: {self.what} compiled in {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
        return out
