"""How a gradient step is taken: the learners' one Adam, and the ways a step runs.

The algorithms write their losses as plain functions of tensors; what is here wraps
the speed around them, picked once when an algorithm is built.

**The Adam.** `Adam(params, lr, eps, max_grad_norm, members)` keeps per parameter its
two moments, and one step count per member; each member has its own learning rate and
clipping norm and depends on its own slices alone, so member k steps exactly as its solo
run's Adam would.
It runs two ways, with the same state:

- `step(grads)`, eagerly: `clip_grad_norm_`'s arithmetic, then torch's fused Adam kernel
  (one pass over every tensor; one call per member), which is what `torch.optim.Adam(...,
  fused=True)` runs, to the bit. With `device_lr` (a step captured as a CUDA graph) the
  learning rates and step counts are device tensors changed in place.
- `adam_update(...)`, the same update written as tensor operations, for a step traced
  by torch.compile (`CompiledDescent`) or run under torch.func.vmap (one
  member's slices: an off-policy population), where the fused kernel cannot go.

PPO's minibatch step runs eagerly in its own update (training.algorithms.ppo), in
chunks where a minibatch is larger than a chunk (training.speed.wrap.chunked_step).

Both are checked against `torch.optim.Adam` (tests/training/test_descent.py).

**The ways a step runs, besides PPO's eager one.**

- `CompiledDescent`: a whole step as one torch.compile'd call (`torch.func.grad` of the
  loss over the parameters, then Adam as tensor operations, in place on the
  parameters and the Adam's own state), which eager PyTorch would run as a few
  hundred operators; a compiler failure prints one line and the caller's eager step
  runs from then on.
- `EagerDescent`: the same interface run eagerly (autograd, then the Adam's step),
  the off-policy learners' default and the compiled one's reference.

A descent takes steps through `step(name, loss_fn, *args)`: minimise `loss_fn(params,
*args) -> (loss, aux)` by one step of the optimizer `name`, returning `aux`.
"""
from __future__ import annotations

import sys
import time

import torch

from gpusim.errors import describe

BETAS = (0.9, 0.999)


class Adam:
    """Clipped Adam over `params` (see the module). `members`: 0 for plain parameters, else
    the size of their leading member dim; `lr` and `max_grad_norm`: a number, or one per
    member; `max_grad_norm` 0 clips nothing."""

    def __init__(self, params, lr, eps: float = 1e-8, max_grad_norm=0.0, members: int = 0,
                 device_lr: bool = False):
        self.params = list(params)
        self.eps, self.members, self.device_lr = eps, members, device_lr
        device = self.params[0].device
        shape = (members,) if members else ()
        self.step_count = torch.zeros(shape, device=device)
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.max_grad_norm = torch.as_tensor(max_grad_norm, dtype=torch.float32,
                                             device=device).expand(shape).clone()
        self.clips = bool((self.max_grad_norm > 0).any())
        self.lr = torch.zeros(shape, device=device if device_lr else "cpu")
        self.set_lr(lr)
        self._views, self._grad_views = None, (None, None)  # members' slices, made once
        for p in self.params:  # backward accumulates into these, at every step the same
            p.grad = torch.zeros_like(p)  # tensors (a captured step needs it so)

    # ---- the learning rate -------------------------------------------------------------
    def set_lr(self, lr):
        """A number, or one per member (a list); a captured step reads the device copy,
        changed in place."""
        rates = [float(r) for r in lr] if isinstance(lr, (list, tuple)) \
            else [float(lr)] * max(1, self.members)
        # the kernel takes a float as a double: the rate as given, not rounded to fp32
        self._rates = rates if self.members else rates[0]
        self.lr.copy_(torch.tensor(rates if self.members else rates[0]), non_blocking=True)

    def rate(self, k: int | None = None):
        """The learning rate the fused kernel takes: member k's (a float, or a device
        tensor in place)."""
        if self.device_lr:
            return self.lr if k is None else self.lr[k]
        return self._rates if k is None else self._rates[k]

    # ---- the eager step --------------------------------------------------------------
    def zero_grad(self):
        """Every parameter's gradient to 0, in place."""
        torch._foreach_zero_([p.grad for p in self.params if p.grad is not None])

    @torch.no_grad()
    def step(self, grads: list | None = None, members=None):
        """Clip, then one Adam step, of every parameter by its gradient in `grads` (default:
        its `.grad`, zero where unset); of the members `members` only (indices; None:
        all)."""
        if grads is None:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p)
                     for p in self.params]
        if self.clips:
            self._clip(grads)
        self.step_count.add_(1)
        beta1, beta2 = BETAS
        common = dict(beta1=beta1, beta2=beta2, weight_decay=0.0, eps=self.eps,
                      amsgrad=False, maximize=False)
        if not self.members:
            torch._fused_adam_(self.params, grads, self.exp_avg, self.exp_avg_sq, [],
                               [self.step_count] * len(grads),
                               lr=self.lr if self.device_lr else self._rates, **common)
            return
        if members is None:
            members = range(self.members)
        elif isinstance(members, torch.Tensor):
            members = members.tolist()
        if self._views is None:  # each member's slices, made once (views of the same storage)
            self._views = [([p[k] for p in self.params], [m[k] for m in self.exp_avg],
                            [v[k] for v in self.exp_avg_sq], [self.step_count[k]] * len(grads))
                           for k in range(self.members)]
        if self._grad_views[0] is not grads:  # (the same list: its views kept)
            self._grad_views = (grads, [[g[k] for g in grads] for k in range(self.members)])
        for k in members:
            params, exp_avg, exp_avg_sq, steps = self._views[k]
            torch._fused_adam_(params, self._grad_views[1][k], exp_avg, exp_avg_sq, [], steps,
                               lr=self.rate(k), **common)

    def _clip(self, grads: list):
        """`torch.nn.utils.clip_grad_norm_` in place on `grads` (each member by its own norm,
        and not at all where its norm is 0)."""
        if not self.members:
            norms = torch._foreach_norm(grads, 2)
            total = torch.linalg.vector_norm(torch.stack(norms), 2)
            coef = torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0)
            torch._foreach_mul_(grads, coef)
            return
        m = self.members
        norms = torch.stack([torch.linalg.vector_norm(g.reshape(m, -1), dim=1) for g in grads], 1)
        total = torch.linalg.vector_norm(norms, dim=1)
        coef = torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0)
        coef = torch.where(self.max_grad_norm > 0, coef, torch.ones_like(coef))
        for g in grads:
            g.mul_(coef.view((m,) + (1,) * (g.dim() - 1)))

    # ---- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"step": self.step_count.clone(), "exp_avg": [m.clone() for m in self.exp_avg],
                "exp_avg_sq": [v.clone() for v in self.exp_avg_sq]}

    def load_state_dict(self, state: dict):
        if len(state["exp_avg"]) != len(self.params):
            raise ValueError(f"the optimizer state holds {len(state['exp_avg'])} tensors; "
                             f"this optimizer has {len(self.params)}")
        self.step_count.copy_(torch.as_tensor(state["step"]).reshape(self.step_count.shape))
        for mine, saved in zip(self.exp_avg + self.exp_avg_sq,
                               state["exp_avg"] + state["exp_avg_sq"]):
            mine.copy_(saved)


def adam_update(params: list, grads: list, exp_avg: list, exp_avg_sq: list, step, lr,
                max_grad_norm, eps: float):
    """`Adam.step` for one member as tensor operations, in place on `params`, the moments
    and `step` (a 0-dim tensor): for torch.compile and torch.func.vmap (out-of-place
    arithmetic, then copied: vmap has no batching rule for lerp_ and addcmul_). `lr` and
    `max_grad_norm` may be tensors; a rate of 0 leaves the parameters as they are, and a
    `max_grad_norm` of 0 clips nothing."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    max_grad_norm = torch.as_tensor(max_grad_norm, dtype=total.dtype, device=total.device)
    scale = torch.where(max_grad_norm > 0, (max_grad_norm / (total + 1e-6)).clamp(max=1.0),
                        torch.ones_like(total))
    beta1, beta2 = BETAS
    step.copy_(step + 1)
    bias1, bias2_sqrt = 1 - beta1 ** step, (1 - beta2 ** step).sqrt()
    lr = torch.as_tensor(lr, dtype=total.dtype, device=total.device)
    for p, g, m, v in zip(params, grads, exp_avg, exp_avg_sq):
        g = g * scale
        m.copy_(torch.lerp(m, g, 1 - beta1))
        v.copy_(v.mul(beta2).addcmul(g, g, value=1 - beta2))
        change = (lr / bias1) * m / (v.sqrt() / bias2_sqrt + eps)
        p.copy_(p - torch.where(lr > 0, change, torch.zeros_like(change)))


class EagerDescent:
    """Steps run eagerly: autograd, then the optimizer's own step. `optimizers`: name ->
    (its parameters by name, its Adam); `reduce(grads)` may sum gradients across ranks
    in place before the step."""

    def __init__(self, optimizers: dict, reduce=None):
        self.optimizers, self.reduce = optimizers, reduce

    def params(self, name: str) -> dict:
        return self.optimizers[name][0]

    def step(self, name: str, loss_fn, *args):
        params, adam = self.optimizers[name]
        loss, aux = loss_fn(params, *args)
        grads = list(torch.autograd.grad(loss, list(params.values())))
        if self.reduce is not None:
            self.reduce(grads)
        adam.step(grads)
        return aux


class _TracedDescent:
    """Inside a compiled call: each optimizer's parameters (detached aliases of the
    module's own tensors) and Adam state, stepped by `adam_update`."""

    def __init__(self, compiled: "CompiledDescent", params: dict, state: dict, lr: dict):
        self.compiled, self.tensors, self.state, self.lr = compiled, params, state, lr

    def params(self, name: str) -> dict:
        return dict(zip(self.compiled.names[name], self.tensors[name]))

    def step(self, name: str, loss_fn, *args):
        grads, aux = torch.func.grad(loss_fn, has_aux=True)(self.params(name), *args)
        adam = self.compiled.optimizers[name]
        exp_avg, exp_avg_sq, step = self.state[name]
        adam_update(self.tensors[name], [grads[n] for n in self.compiled.names[name]],
                    exp_avg, exp_avg_sq, step, self.lr[name], adam.max_grad_norm, adam.eps)
        return aux


class CompiledDescent:
    """`body(descent, *inputs)`, which takes its steps through `descent.step`, as one
    compiled call (see the module). `optimizers`: name -> (its parameters by name, its
    Adam, with no member dim). Calling it returns what `body` returns, or None once
    compiling failed (the caller then steps eagerly)."""

    def __init__(self, optimizers: dict, body, what: str, dynamic: bool = False):
        """`dynamic`: the inputs' sizes change from call to call (one graph for every size,
        rather than a recompile per size)."""
        self.body, self.what = body, what
        self.optimizers = {name: adam for name, (_, adam) in optimizers.items()}
        self.names = {name: list(params) for name, (params, _) in optimizers.items()}
        # detached aliases of the parameters (loading a checkpoint copies into the same
        # tensors): the compiled step updates them in place
        self.aliases = {name: [p.detach() for p in params.values()]
                        for name, (params, _) in optimizers.items()}
        self.lr = {name: torch.zeros((), device=self.aliases[name][0].device)
                   for name in self.optimizers}
        self.compiled = torch.compile(self._step, dynamic=dynamic or None)
        self.compiled_once = False  # the first call compiles (or loads from the disk cache)

    def _step(self, params, state, lr, *inputs):
        return self.body(_TracedDescent(self, params, state, lr), *inputs)

    def __call__(self, *inputs):
        if self.compiled is None:
            return None
        state = {}
        for name, adam in self.optimizers.items():
            # (a tensor: a changed float would recompile)
            self.lr[name].copy_(adam.lr) if adam.device_lr else self.lr[name].fill_(adam.rate())
            state[name] = (adam.exp_avg, adam.exp_avg_sq, adam.step_count)
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
