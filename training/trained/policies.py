"""Trained policies to take anywhere: `load_policies(run_dir)` (public as
`gpusim.load_policies`).

A run directory holds all that acting needs: its config.yaml (the env and its
config, the algorithm, the networks' shape) and its checkpoints. The loader
reads both and returns one `Policy` per policy name, which acts on plain
arrays, in any client: no env is built and no env kernel compiled (the env's
`setup` alone says each policy's spaces: `Env.declared`). Of each network only
the acting part is loaded; critics, target networks and SAC's temperature are
dropped, so a central critic's input size never matters here.

`ActingNetwork` is a policy's deterministic action as a module: what
`act(..., deterministic=True)` runs, and what training.trained.network_export writes.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gpusim.errors import GpusimError, describe

from ..algorithms import algorithm_class
from ..population import members as population
from ..records import checkpoint
from ..run_config import load_run_dir_config
from . import member_runs as members

# Submodules and parameters that training needs and acting does not: the critics (of
# every algorithm), the off-policy target copies and SAC's log-alpha.
NOT_ACTING = ("critic", "critics", "target_critics", "target_actor", "log_alpha")


class ActingNetwork(nn.Module):
    """forward(obs[, state][, mask]) -> the deterministic action[, the next state].

    The action is the env's: int64 choice indices (..., components), or float32 values
    in the Box (..., dims). `state` comes in (and the next one out) where the policy is
    recurrent, `mask` (bool, (..., sum of choices)) where the env masks choices.
    """

    def __init__(self, model, spec, masked: bool):
        super().__init__()
        self.model = model
        self.nvec = None if spec.continuous else tuple(spec.actions)
        self.recurrent = getattr(model, "state_size", 0) > 0
        self.masked = masked

    def forward(self, obs, *extra):
        state = extra[0] if self.recurrent else None
        mask = extra[-1] if self.masked else None
        action, nxt = self.decide(obs, state, mask, deterministic=True)
        return (action, nxt) if self.recurrent else action

    def decide(self, obs, state, mask, deterministic: bool):
        """(action, next state or None); stochastic draws use torch's generator."""
        carried = (state,) if self.recurrent else ()
        if self.nvec is None:
            out = self.model.sample(obs, deterministic, *carried)
            return out[2], (out[-1] if self.recurrent else None)
        out = self.model.log_probs(obs, mask, *carried)
        log_probs = out[0] if self.recurrent else out
        parts = torch.split(log_probs, self.nvec, -1)
        if not deterministic:  # Gumbel-max: argmax of log p - log E, E ~ Exp(1), draws from p
            parts = [p - torch.empty_like(p).exponential_().log() for p in parts]
        action = torch.stack([p.argmax(-1) for p in parts], -1)
        return action, (out[-1] if self.recurrent else None)


class Policy:
    """One trained policy: `act`, `initial_state`, its spaces and its agents' names."""

    def __init__(self, name, spec, model, declared, masked: bool, device):
        self.name, self.spec, self.device = name, spec, device
        self.network = ActingNetwork(model, spec, masked)
        self.state_size = int(getattr(model, "state_size", 0))
        self.masked = masked
        self.agent_names = tuple(declared.agent_names[i] for i in spec.agent_ids)
        self._declared = declared

    @property
    def model(self) -> nn.Module:
        """The acting part of the trained network, as training.actors acts with it."""
        return self.network.model

    @property
    def recurrent(self) -> bool:
        return self.state_size > 0

    @property
    def observation_space(self):
        """One agent's observation: a gymnasium float32 Box of `spec.obs_dim` entries."""
        return self._declared.observation_space[self.name]

    @property
    def action_space(self):
        """One agent's action: a gymnasium MultiDiscrete (choices per component) or Box."""
        return self._declared.action_space[self.name]

    def initial_state(self, batch: int | None = None):
        """The recurrent state an episode starts from, zeros: (batch, state_size), or
        (state_size,) without a batch; None for a policy without one."""
        if not self.recurrent:
            return None
        shape = (self.state_size,) if batch is None else (int(batch), self.state_size)
        return torch.zeros(shape, device=self.device)

    def act(self, obs, deterministic: bool = False, state=None, mask=None):
        """(actions, next state) for `obs`: one observation (obs_dim,) or a batch of them
        (..., obs_dim), a numpy array (numpy comes back) or a torch tensor (tensors come
        back, on the policy's device). The actions are the env's: integers per action
        component, or values in the Box. The state is None for a feed-forward policy;
        for a recurrent one, pass back the state it returned (None: `initial_state`),
        and restart it when an episode ends. `mask`: where the env masks choices, the
        legal ones (bool, (..., sum of the choices)). Deterministic: the most likely
        choice, the Gaussian's mean (the deterministic actor's action, untouched)."""
        as_numpy = not isinstance(obs, torch.Tensor)
        obs = self._tensor(obs, "obs", torch.float32)
        if obs.dim() == 0 or obs.shape[-1] != self.spec.obs_dim:
            raise GpusimError(f"policy {self.name!r} observes {self.spec.obs_dim} entries: obs "
                              f"must have shape (..., {self.spec.obs_dim}), got "
                              f"{tuple(obs.shape)}")
        if not bool(torch.isfinite(obs).all()):  # a NaN acts as some arbitrary action
            where = tuple(int(i) for i in (~torch.isfinite(obs)).nonzero()[0])
            raise GpusimError(f"policy {self.name!r}: obs{list(where)} is "
                              f"{float(obs[where])}: it acts on finite observations only")
        lead = tuple(obs.shape[:-1])
        state = self._checked_state(state, lead)
        mask = self._checked_mask(mask, lead)
        with torch.no_grad():
            action, nxt = self.network.decide(obs, state, mask, bool(deterministic))
        if as_numpy:
            return action.cpu().numpy(), None if nxt is None else nxt.cpu().numpy()
        return action, nxt

    def _tensor(self, value, what: str, dtype) -> torch.Tensor:
        try:
            tensor = torch.as_tensor(value if isinstance(value, torch.Tensor)
                                     else np.asarray(value), device=self.device)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise GpusimError(f"policy {self.name!r}: {what} must be an array of numbers "
                              f"({describe(exc)[:100]})") from None
        if dtype != torch.bool and (tensor.dtype == torch.bool or tensor.is_complex()):
            raise GpusimError(f"policy {self.name!r}: {what} must hold real numbers, got "
                              f"{tensor.dtype}")
        return tensor.to(dtype)

    def _checked_state(self, state, lead: tuple):
        if not self.recurrent:
            if state is not None:
                raise GpusimError(f"policy {self.name!r} has no recurrent state: pass "
                                  "state=None")
            return None
        if state is None:
            return torch.zeros(lead + (self.state_size,), device=self.device)
        state = self._tensor(state, "state", torch.float32)
        if tuple(state.shape) != lead + (self.state_size,):
            raise GpusimError(f"policy {self.name!r}: state must have shape "
                              f"{lead + (self.state_size,)} (the obs's leading dims, then "
                              f"state_size), got {tuple(state.shape)}")
        return state

    def _checked_mask(self, mask, lead: tuple):
        if mask is None:
            return None
        if self.spec.continuous:
            raise GpusimError(f"policy {self.name!r} acts in a Box: it takes no mask")
        width = sum(self.spec.actions)
        mask = self._tensor(mask, "mask", torch.bool)
        if tuple(mask.shape) != lead + (width,):
            raise GpusimError(f"policy {self.name!r}: mask must have shape {lead + (width,)} "
                              f"(one entry per choice), got {tuple(mask.shape)}")
        return mask

    def __repr__(self):
        kind = "recurrent " if self.recurrent else ""
        return (f"<Policy {self.name!r}: {kind}{self.spec.obs_dim} observations -> "
                f"{self.spec.actions}, agents {', '.join(self.agent_names)}>")


class Policies(dict):
    """Policy name -> `Policy`; `by_agent`: agent name -> its policy. A name that is not
    there is a GpusimError naming those that are."""

    def __init__(self, policies: dict, run_dir):
        super().__init__(policies)
        self.run_dir = run_dir
        self.by_agent = _Named({agent: policy for policy in policies.values()
                                for agent in policy.agent_names}, f"{run_dir}", "agent")

    def __missing__(self, name):
        raise GpusimError(f"{self.run_dir} has no policy {name!r} (its policies: "
                          f"{', '.join(self)})")


class _Named(dict):
    def __init__(self, items: dict, where: str, what: str):
        super().__init__(items)
        self.where, self.what = where, what

    def __missing__(self, name):
        shown = ", ".join(list(self)[:8]) + (", ..." if len(self) > 8 else "")
        raise GpusimError(f"{self.where} has no {self.what} {name!r} (its {self.what}s: "
                          f"{shown})")


class _NoEnv:
    """What `acting_model` reads of an env, for a network whose critic is dropped: the
    central critic's input width is a placeholder, never used."""

    def __init__(self, declared):
        self.policy_specs = declared.policy_specs
        self.device = torch.device("cpu")

    @staticmethod
    def global_state(final: bool = False):
        return torch.zeros(1, 1)


def load_policies(run_dir, device="cpu", member=None) -> Policies:
    """The trained policies of a run's latest checkpoint, one per policy name, on
    `device` (a torch device: "cpu", "cuda:0"). Needs no env built (see the module). Of a
    population run, member `member` ("m3" or 3; default: the best by its last logged
    return), with one line saying which."""
    if not isinstance(run_dir, (str, os.PathLike)):
        raise GpusimError(f"load_policies: run_dir must be a run directory's path (a str or "
                          f"pathlib.Path), got {type(run_dir).__name__}")
    run_dir = Path(run_dir)
    cls, config = load_run_dir_config(run_dir)
    saved = _saved_models(run_dir)
    if population.size(config.trainer) > 1:
        k, line = members.pick(run_dir, config, member)
        print(line, file=sys.stderr, flush=True)
        saved = members.member_models(saved, k)
    elif member is not None:
        raise GpusimError(f"{run_dir} is a solo run: a member applies to a population run")
    declared = cls.declared(config.env)
    device = _device(device)
    algorithm = algorithm_class(config.trainer.algorithm)
    masked = declared.action_mask_array is not None
    policies = {}
    for name, spec in declared.policy_specs.items():
        model = acting_part(algorithm.acting_model(config, _NoEnv(declared), spec))
        _load_acting(model, saved.get(name), name, run_dir)
        model = model.to(device).eval().requires_grad_(False)
        policies[name] = Policy(name, spec, model, declared, masked and not spec.continuous,
                                device)
    return Policies(policies, run_dir)


def acting_part(model: nn.Module) -> nn.Module:
    """`model` without what only training uses (NOT_ACTING), in place."""
    for module in list(model.modules()):
        for name in NOT_ACTING:
            if name in module._modules or name in module._parameters:
                setattr(module, name, None)
    return model


def _saved_models(run_dir: Path) -> dict:
    state = checkpoint.load_latest(run_dir / "checkpoints")
    algorithm = state.get("algorithm")
    models = algorithm.get("models") if isinstance(algorithm, dict) else None
    if not isinstance(models, dict):
        raise GpusimError(f"{run_dir}: its checkpoint was not written by this version of "
                          "gpusim's trainer")
    return models


def _load_acting(model: nn.Module, saved, name: str, run_dir: Path):
    """Load the acting weights of policy `name`; all of them must be there and fit."""
    wanted = model.state_dict()
    missing = [key for key in wanted if not isinstance(saved, dict) or key not in saved]
    if missing:
        raise GpusimError(f"{run_dir}: the checkpoint's policy {name!r} lacks "
                          f"{missing[0]} (it was not written for this run's config)")
    try:
        model.load_state_dict({key: saved[key] for key in wanted})
    except (RuntimeError, TypeError) as exc:
        raise GpusimError(f"{run_dir}: the checkpoint's policy {name!r} does not fit the "
                          f"run's config ({describe(exc)[:120]})") from None


def _device(device) -> torch.device:
    try:
        device = torch.device(device)
        torch.empty(0, device=device)  # the device exists and is usable
    except (RuntimeError, TypeError, AssertionError) as exc:
        raise GpusimError(f"device {device!r} is not available here "
                          f"({describe(exc)[:100]})") from None
    return device
