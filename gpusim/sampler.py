"""On-device sampling of multi-discrete actions from per-agent probabilities.

Each agent draws from its own RNG stream (the env's `rng_state`), so sampling
is reproducible and identical on every backend.
"""
from __future__ import annotations

import numba
import numpy as np
import torch

from gpusim import rng
from gpusim.arrays import namedtuple_type
from gpusim.errors import ArrayError
from gpusim.kernels import KernelSpec, agent_phase


@numba.jit(nopython=True)
def sample_agent(env, agent, s, p):
    """For each component: inverse-CDF draw (or argmax) over its slice of `probs`."""
    for c in range(s.nvec.shape[0]):
        start = s.offsets[c]
        n = s.nvec[c]
        choice = 0
        if p.argmax:
            best = s.probs[env, agent, start]
            for k in range(1, n):
                if s.probs[env, agent, start + k] > best:
                    best = s.probs[env, agent, start + k]
                    choice = k
        else:
            u = rng.uniform(s.rng_state, env, agent)
            total = numba.float32(0.0)
            for k in range(n):
                total += s.probs[env, agent, start + k]
            target = u * total  # probabilities need not sum exactly to 1
            cumulative = numba.float32(0.0)
            choice = -1
            for k in range(n):
                weight = s.probs[env, agent, start + k]
                cumulative += weight
                if weight > 0:
                    choice = k  # last positive-weight index: a rounding-proof fallback
                    if target < cumulative:
                        break
            if choice < 0:
                choice = 0
        s.actions[env, agent, c] = choice


SAMPLE_SPEC = KernelSpec.of("sample_actions", agent_phase(sample_agent),
                            cuda_c="sampler.cu:sample_actions")


class ActionSampler:
    """`sampler.sample(probs)` -> (num_envs, num_agents, len(nvec)) int32 actions.

    `probs` is (num_envs, num_agents, sum(action_nvec)) float32 on the env's
    device: the components' probability vectors side by side. The returned
    tensor is the sampler's own buffer, overwritten by the next call.
    """

    def __init__(self, env):
        self.env = env
        self.backend = env.backend
        nvec = np.asarray(env.action_nvec, dtype=np.int32)
        self._nvec = torch.from_numpy(nvec).to(env.device)
        self._offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(nvec)[:-1]])
                                         .astype(np.int32)).to(env.device)
        self.width = int(nvec.sum())
        self.actions = torch.zeros((env.num_envs, env.num_agents, len(nvec)),
                                   dtype=torch.int32, device=env.device)
        self._fixed = [self.backend.view(t) for t in
                       (env.rng_state, self.actions, self._nvec, self._offsets)]
        self._arrays_type = namedtuple_type("SamplerArrays",
                                            ("rng_state", "actions", "nvec", "offsets", "probs"))
        # The sizes ride along as parameters for the CUDA C kernel, which gets bare pointers.
        self._params_type = namedtuple_type("SamplerParams", ("argmax", "num_components", "width"))
        self._sizes = (np.int32(len(nvec)), np.int32(self.width))
        # Compile for the argument types now (a tiny probs tensor has the same type).
        example_probs = torch.zeros((1, 1, self.width), device=env.device)
        self._kernel = self.backend.compile(
            SAMPLE_SPEC, self._arrays_type(*self._fixed, self.backend.view(example_probs)),
            self._params_type(np.bool_(False), *self._sizes))
        self._last = (None, None)  # (probs tensor, its arrays tuple): reuse views

    def sample(self, probs: torch.Tensor, argmax: bool = False) -> torch.Tensor:
        arrays = self._arrays_for(probs)
        self._kernel(self.env.num_envs, self.env.num_agents, arrays,
                     self._params_type(np.bool_(argmax), *self._sizes))
        return self.actions

    def _arrays_for(self, probs):
        if self._last[0] is probs:
            return self._last[1]
        expected = (self.env.num_envs, self.env.num_agents, self.width)
        self.backend.check_tensor("probs", probs)
        if probs.dtype != torch.float32:
            raise ArrayError(f"array 'probs' must have dtype torch.float32, got {probs.dtype}")
        if tuple(probs.shape) != expected:
            raise ArrayError(f"array 'probs' must have shape {expected} "
                             f"(num_envs, num_agents, sum(action_nvec)), got {tuple(probs.shape)}")
        arrays = self._arrays_type(*self._fixed, self.backend.view(probs))
        self._last = (probs, arrays)
        return arrays
