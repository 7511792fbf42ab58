"""Writing the actions `Env.step` is given into the env's action arrays: `ActionWriter`, a
base class of gpusim.env.Env.

Actions come as one tensor for every agent, or as a dict of one tensor per
policy (its agents in the order of its `agent_ids`; needed when policies act
differently). Discrete ones must be integers: out of their range they are
refused with `check_actions` (checked in the given dtype), else clamped into it.
Continuous ones must be floats: not finite they are refused with
`check_actions`; out of bounds the step kernel clips them.
"""
from __future__ import annotations

import numpy as np
import torch

from gpusim.errors import ArrayError


class ActionWriter:
    """The action-writing half of `gpusim.env.Env`."""

    def _write_actions(self, actions):
        if isinstance(actions, dict):
            self._write_policy_actions(actions)
            return
        if self.mixed_actions:
            raise ArrayError(f"{self.name}'s policies act in different action spaces: "
                             "pass actions as a dict policy name -> tensor")
        actions = _as_tensor(actions, "actions")
        if self.continuous_dim:
            self._write_continuous(actions, slice(None), "actions",
                                   (self.num_envs, self.num_agents, self.continuous_dim))
        else:
            self._write_discrete(actions, slice(None), "actions",
                                 (self.num_envs, self.num_agents, len(self.action_nvec)),
                                 self._nvec)

    def _write_policy_actions(self, actions: dict):
        if set(actions) != set(self.policy_specs):
            raise ArrayError(f"actions must hold one tensor per policy "
                             f"({', '.join(self.policy_specs)}), got {', '.join(map(str, actions))}")
        for name, value in actions.items():
            spec, what = self.policy_specs[name], f"actions[{name!r}]"
            shape = (self.num_envs, spec.num_agents, spec.action_width)
            value = _as_tensor(value, what)
            if spec.continuous:
                self._write_continuous(value, self._policy_index[name], what, shape)
            else:
                self._write_discrete(value, self._policy_index[name], what, shape,
                                     self._policy_nvec[name])

    def _write_continuous(self, actions, agents, what, expected):
        if not actions.dtype.is_floating_point:
            raise ArrayError(f"{what} are continuous: they must have a float dtype, "
                             f"got {actions.dtype}")
        if tuple(actions.shape) != expected:
            raise ArrayError(f"{what} must have shape {expected}, got {tuple(actions.shape)}")
        if self.check_actions and not bool(torch.isfinite(actions).all()):
            e, i, c = (int(v) for v in (~torch.isfinite(actions)).nonzero()[0])
            raise ArrayError(f"action is not finite: {what}[{e}, {i}, {c}] = "
                             f"{float(actions[e, i, c])}")
        # out of bounds is allowed: the step kernel clips into the bounds
        self.arrays["continuous_actions"][:, agents, :expected[2]] = actions

    def _write_discrete(self, actions, agents, what, expected, nvec):
        if actions.dtype.is_floating_point or actions.dtype.is_complex or actions.dtype == torch.bool:
            raise ArrayError(f"{what} must have an integer dtype, got {actions.dtype}")
        if tuple(actions.shape) != expected:
            raise ArrayError(f"{what} must have shape {expected} "
                             f"(num_envs, agents, len(action_nvec)), got {tuple(actions.shape)}")
        if isinstance(agents, slice):  # a view: checked or clamped in place
            self._check_or_clamp(actions, self.arrays["actions"][:, agents, :expected[2]],
                                 what, nvec)
            return
        some = torch.empty(expected, dtype=torch.int32, device=self.device)  # a policy's agents
        self._check_or_clamp(actions, some, what, nvec)
        self.arrays["actions"][:, agents, :expected[2]] = some

    def _check_or_clamp(self, actions, buffer, what, nvec):
        """Copy `actions` into `buffer`: refused when out of `nvec`'s range (check_actions),
        else clamped into it."""
        largest = nvec - 1
        if self.check_actions:  # in the given dtype: an int64 2**32 + 1 must not wrap to 1
            bad = (actions < 0) | (actions >= nvec.to(actions.device))
            if bool(bad.any()):
                e, i, c = (int(v) for v in bad.nonzero()[0])
                raise ArrayError(
                    f"action out of range: {what}[{e}, {i}, {c}] = {int(actions[e, i, c])}, "
                    f"component {c} takes 0..{int(largest[c])}")
            buffer.copy_(actions)
            return
        if actions.dtype != buffer.dtype:  # clamp before the narrowing copy, not after
            actions = torch.minimum(actions.clamp(min=0), largest.to(actions.device))
        buffer.copy_(actions)
        torch.clamp_(buffer, min=0)
        torch.minimum(buffer, largest, out=buffer)


def _as_tensor(actions, what: str) -> torch.Tensor:
    if isinstance(actions, np.ndarray):
        return torch.from_numpy(actions)
    if not isinstance(actions, torch.Tensor):
        raise ArrayError(f"{what} must be a torch tensor, got {type(actions).__name__}")
    return with_data(actions, what)


def with_data(value, what: str):
    """`value`, unless it is a tensor without data (on the meta device)."""
    if isinstance(value, torch.Tensor) and value.is_meta:
        raise ArrayError(f"{what} is on the meta device, which holds no values: "
                         "pass a tensor with data")
    return value
