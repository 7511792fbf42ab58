"""Scripted policies: fixed opponents that ship with an env (a chaser, a fleer), a
yardstick that does not move while the policies learn.

An env offers them in a module `scripted.py` beside its env.py, as
`SCRIPTED = {policy name: {label: class}}`. Each class is built as `cls(env, policy name)`
and acts as a policy does for training.actors: `log_probs(obs, mask)` puts its choice at
log-probability 0 and every other at -inf, so the sampler can draw only that one. The
choice is decided from the env's state arrays with torch operations on the device: no
host read per step. They are not networks: they cannot be exported, trained, or stacked
with networks in one batched product (cross-play plays them in tiles of their own).
"""
from __future__ import annotations

import importlib

import torch

from .errors import GpusimError


def scripted_policies(env_class) -> dict:
    """{policy name: {label: class}} of an env (its package's scripted.py); {} where the
    env ships none."""
    package = env_class.__module__.rpartition(".")[0]
    if not package:
        return {}
    try:
        module = importlib.import_module(f"{package}.scripted")
    except ModuleNotFoundError as exc:
        if exc.name == f"{package}.scripted":
            return {}
        raise
    return module.SCRIPTED


class ScriptedPolicy:
    """A scripted policy of discrete actions: a subclass says `choose()`."""
    state_size = 0

    def __init__(self, env, policy: str):
        spec = env.policy_specs[policy]
        if spec.continuous:
            raise GpusimError(f"{env.name}'s scripted {policy} plays discrete actions: not "
                              "with env.continuous_actions: true")
        self.env, self.policy = env, policy
        self.agents = torch.tensor(spec.agent_ids, device=env.device)
        self.nvec = tuple(spec.actions)

    def choose(self) -> torch.Tensor:
        """(replicas, the policy's agents, components): each component's choice index."""
        raise NotImplementedError

    def log_probs(self, obs, mask=None):
        choice = self.choose()
        parts = [torch.full(choice.shape[:2] + (n,), float("-inf"), device=choice.device)
                 .scatter_(-1, choice[..., k:k + 1], 0.0) for k, n in enumerate(self.nvec)]
        return torch.cat(parts, -1)


def nearest(here: torch.Tensor, there: torch.Tensor, present=None) -> torch.Tensor:
    """here (R, A, 2), there (R, B, 2): for each of A, the offset (R, A, 2) to the nearest
    of B (`present` (R, B) bool: only those; none present: a zero offset)."""
    offset = there[:, None] - here[:, :, None]  # (R, A, B, 2)
    distance = offset.square().sum(-1)
    if present is not None:
        distance = distance.masked_fill(~present[:, None], float("inf"))
    k = distance.argmin(-1)  # (R, A)
    picked = torch.gather(offset, 2, k[..., None, None].expand(-1, -1, 1, 2))[:, :, 0]
    if present is None:
        return picked
    return picked * present.any(-1)[:, None, None]
