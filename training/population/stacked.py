"""N networks of one shape as one: their parameters stacked on a leading member dim
(`StackedPolicy`).

A population's acting and critic passes (training.algorithms.ppo_members), a league's
pool of snapshots and the judge's players run the actor-critics of training.models
directly on stacked weights (`lead`: their linear layers multiply them as one batched
product, `models.linear`), each member (or replica) on its own network; any other
network runs under torch.func.vmap (`run`; the off-policy populations'). A
population's update differentiates the solo loss under vmap instead, over the
functional form of the stacked network (`calls`).
"""
from __future__ import annotations

import copy

import torch
from torch import nn


class _Call(nn.Module):
    """Calls one method of the network it holds (functional_call runs `forward` only)."""

    def __init__(self, net: nn.Module, method: str):
        super().__init__()
        self.net, self.method = net, method

    def forward(self, *inputs):
        return getattr(self.net, self.method)(*inputs)


class StackedPolicy(nn.Module):
    """N networks of one shape as one: their parameters and buffers stacked on a leading
    member dim. Each method of the network it stacks (`log_probs`, `sample`, `value`,
    `forward`) takes inputs whose leading dim holds the members' rows side by side
    (member k's are the k-th of N equal parts) and runs every member at once.

    A network whose class says `members_lead = True` (training.models' actor-critics)
    runs directly on stacked tensors (`lead`): its MLPs multiply stacked weights as one
    batched product, and its other parameters are swapped in shaped to broadcast over the
    members. Any other runs under torch.func.vmap over functional_call (`run`)."""

    def __init__(self, nets: list):
        super().__init__()
        self.size = len(nets)
        # the network's structure; its own weights are never used (the members' are swapped
        # in), so it is no submodule: neither in state_dict nor moved by .to()
        template = copy.deepcopy(nets[0]).to("meta")
        object.__setattr__(self, "template", template)
        self.state_size = getattr(nets[0], "state_size", 0)
        self.direct = getattr(type(nets[0]), "members_lead", False)  # `run` through `lead`
        params, buffers = torch.func.stack_module_state(nets)
        self.param_names, self.buffer_names = list(params), list(buffers)
        for name, value in params.items():
            self.register_parameter(flat_name(name), nn.Parameter(value))
        for name, value in buffers.items():
            self.register_buffer(flat_name(name), value)
        object.__setattr__(self, "calls", {m: _Call(template, m) for m in (
            "log_probs", "sample", "value", "forward")})
        # where each stacked tensor goes in the template: (its owner's dict, its key,
        # whether it is a linear layer's, which the MLPs take stacked as they are)
        slots = []
        for name in self.param_names + self.buffer_names:
            *path, key = name.split(".")
            owner = template.get_submodule(".".join(path))
            table = owner._parameters if key in owner._parameters else owner._buffers
            slots.append((table, key, isinstance(owner, nn.Linear)))
        object.__setattr__(self, "slots", slots)

    def stacked(self) -> tuple:
        """(parameters, buffers) by the stacked network's names, each (N, ...)."""
        return ({n: getattr(self, flat_name(n)) for n in self.param_names},
                {n: getattr(self, flat_name(n)) for n in self.buffer_names})

    def member(self, k: int) -> dict:
        """Member k's state dict, as its own network would have it."""
        params, buffers = self.stacked()
        return {n: t[k].detach().clone() for n, t in {**params, **buffers}.items()}

    def run(self, method: str, *inputs, randomness: str = "error"):
        """`method` of every member on its share of `inputs` (None: not batched): through
        `lead` for a `members_lead` network, else under torch.func.vmap."""
        split = tuple(None if x is None or not isinstance(x, torch.Tensor)
                      else x.reshape((self.size, -1) + x.shape[1:]) for x in inputs)
        if self.direct:
            return _merge(self.lead(method, *(x if x is not None else raw
                                              for x, raw in zip(split, inputs))))
        params, buffers = self.stacked()
        prefixed = ({f"net.{n}": t for n, t in params.items()},
                    {f"net.{n}": t for n, t in buffers.items()})
        dims = tuple(None if x is None else 0 for x in split)
        batched = [x if x is not None else raw for x, raw in zip(split, inputs)]

        def one(p, b, *xs):
            return torch.func.functional_call(self.calls[method], (p, b), xs)
        out = torch.func.vmap(one, in_dims=(0, 0) + dims, randomness=randomness)(
            prefixed[0], prefixed[1], *batched)
        return _merge(out)

    def lead(self, method: str, *inputs, tensors: list | None = None):
        """`method` of a `members_lead` network on inputs (N, ...) of every member at once,
        its outputs (N, ...); on `tensors` (the stacked parameters and buffers in
        `param_names + buffer_names` order, e.g. a subset of the members') where given."""
        if tensors is None:
            params, buffers = self.stacked()
            tensors = list(params.values()) + list(buffers.values())
        rank = next(x.dim() for x in inputs if isinstance(x, torch.Tensor))
        saved = [table[key] for table, key, _ in self.slots]
        try:
            for (table, key, linear), value in zip(self.slots, tensors):
                if not linear:  # (N, 1, .., *shape): broadcasts as shape does for one
                    ones = max(0, rank - value.dim())
                    value = value.reshape(value.shape[:1] + (1,) * ones + value.shape[1:])
                table[key] = value
            return getattr(self.template, method)(*inputs)
        finally:
            for (table, key, _), value in zip(self.slots, saved):
                table[key] = value

    def log_probs(self, obs, mask=None):
        return self.run("log_probs", obs, mask)

    def sample(self, obs, deterministic: bool = False):
        """With `generators` (one per member), member k's exploration noise comes from
        its own, in the order a solo run of it draws; else from torch's."""
        generators = getattr(self, "generators", None)
        if deterministic or generators is None:
            return self.run("sample", obs, deterministic, randomness="different")
        share = (obs.shape[0] // self.size,) + obs.shape[1:-1] + (self.template.dim,)
        noise = torch.cat([torch.randn(share, generator=g, device=obs.device)
                           for g in generators])
        return self.run("sample", obs, False, noise)

    def value(self, critic_obs):
        return self.run("value", critic_obs)

    def forward(self, obs, actions, mask=None, critic_obs=None):
        return self.run("forward", obs, actions, mask, critic_obs)


def check_stack_fits(backend, what: str, models: list, copies: int):
    """Refuse, before a copy is made, stacks of `copies` of each of `models` larger than the
    free memory, in one line that starts with `what` (a stack is built from its copies:
    twice its size at once)."""
    size = sum(t.numel() * t.element_size()
               for m in models for t in (*m.parameters(), *m.buffers()))
    backend.check_fits(what, 2 * copies * size)


def flat_name(name: str) -> str:
    """A network's state-dict key as the stacked network names it (module attributes
    cannot hold dots); `unflat_name` undoes it."""
    return name.replace(".", "__")


def unflat_name(name: str) -> str:
    return name.replace("__", ".")


def _merge(out):
    """vmap's (N, R, ...) outputs as (N * R, ...), the members' rows side by side."""
    if isinstance(out, tuple):
        return tuple(_merge(o) for o in out)
    if isinstance(out, torch.Tensor) and out.dim() >= 2:
        return out.reshape((-1,) + out.shape[2:])
    return out
