"""On-device sampling of multi-discrete actions from per-agent probabilities.

Each agent draws from its own RNG stream (the env's `rng_state`), so sampling
is reproducible and identical on every backend. The same launch writes the
log-probability of the drawn actions, so a trainer needs no gather after it.
Agents of different policies may have different action sets: the choices
per component are a per-agent table (0 for a component the agent lacks,
and for every component of an agent that acts continuously).
"""
from __future__ import annotations

import math

import numba
import numpy as np
import torch

from gpusim import rng
from gpusim.arrays import namedtuple_type
from gpusim.errors import ArrayError, GpusimError
from gpusim.kernels import KernelSpec, agent_phase


@numba.jit(nopython=True)
def _weight(s, p, env, agent, k):
    """The (unnormalised) probability of entry k: the value itself, or exp of a log-prob.

    exp runs in float64 and rounds to float32, so every backend gets the same weight.
    """
    value = s.probs[env, agent, k]
    if p.log_space:
        return numba.float32(math.exp(numba.float64(value)))
    return value


@numba.jit(nopython=True)
def sample_agent(env, agent, s, p):
    """Per component: an inverse-CDF draw (or the argmax) over its slice of `probs`.

    Also writes the log-probability of the drawn actions, summed over components.
    """
    log_prob = numba.float32(0.0)  # summed in float32, as torch sums the components
    for c in range(s.nvec.shape[1]):
        start = s.offsets[agent, c]
        n = s.nvec[agent, c]
        if n == 0:  # a component this agent does not have
            s.actions[env, agent, c] = 0
            continue
        total = numba.float32(0.0)
        for k in range(n):
            total += _weight(s, p, env, agent, start + k)
        choice = 0
        if p.argmax:  # exp is monotonic: the raw values give the same argmax
            best = s.probs[env, agent, start]
            for k in range(1, n):
                if s.probs[env, agent, start + k] > best:
                    best = s.probs[env, agent, start + k]
                    choice = k
        else:
            target = rng.uniform(s.rng_state, env, agent) * total  # weights need not sum to 1
            cumulative = numba.float32(0.0)
            choice = -1
            for k in range(n):
                weight = _weight(s, p, env, agent, start + k)
                cumulative += weight
                if weight > 0:
                    choice = k  # last positive-weight index: a rounding-proof fallback
                    if target < cumulative:
                        break
            if choice < 0:
                choice = 0
        s.actions[env, agent, c] = choice
        if p.log_space:
            log_prob += s.probs[env, agent, start + choice]
        else:
            log_prob += numba.float32(math.log(numba.float64(s.probs[env, agent, start + choice]))
                                      - math.log(numba.float64(total)))
    s.log_prob[env, agent] = log_prob


SAMPLE_SPEC = KernelSpec.of("sample_actions", agent_phase(sample_agent),
                            cuda_c="sampler.cu:sample_actions")


class ActionSampler:
    """`sampler.sample(probs)` -> (num_envs, num_agents, len(nvec)) int32 actions.

    `probs` is (num_envs, num_agents, width) float32 on the env's device,
    `width` the largest sum(nvec) of a discrete policy: an agent's
    components' probability vectors side by side from entry 0 (weights that
    need not sum to 1), or with `log_space=True` their log-probabilities
    (e.g. a policy's log-softmax; the kernel's scalar exp costs more on a CPU
    than a torch exp pass first, which is what training.actors does);
    entries beyond its own sum(nvec) are not read. The returned actions
    (num_envs, num_agents, most components) are the sampler's own buffer,
    overwritten by the next call (0 for components an agent lacks); so is
    `sampler.log_prob` (num_envs, num_agents): the log-probability of the
    drawn actions under `probs`, summed over components (the given values
    themselves in log space; 0 for an agent that acts continuously).
    """

    def __init__(self, env, into_env: bool = False):
        """`into_env`: draw straight into the env's own `actions` array (then step with
        `env.step()`), instead of a buffer of the sampler's own."""
        if all(p.continuous for p in env.policy_specs.values()):
            raise GpusimError(f"ActionSampler draws discrete actions, and every policy of "
                              f"{env.name} acts continuously (a Box): draw those with torch, "
                              "within env.action_space's bounds")
        self.env = env
        self.backend = env.backend
        nvec, offsets = agent_tables(env)
        self._nvec = torch.from_numpy(nvec).to(env.device)
        self._offsets = torch.from_numpy(offsets).to(env.device)
        self.width = max(1, int(nvec.sum(1).max()))
        components = nvec.shape[1]
        self.actions = env.arrays["actions"] if into_env else \
            torch.zeros((env.num_envs, env.num_agents, components), dtype=torch.int32,
                        device=env.device)
        self.log_prob = torch.zeros((env.num_envs, env.num_agents), device=env.device)
        self._fixed = [self.backend.view(t) for t in
                       (env.rng_state, self.actions, self.log_prob, self._nvec, self._offsets)]
        self._arrays_type = namedtuple_type(
            "SamplerArrays", ("rng_state", "actions", "log_prob", "nvec", "offsets", "probs"))
        # The sizes ride along as parameters for the CUDA C kernel, which gets bare pointers.
        self._params_type = namedtuple_type(
            "SamplerParams", ("argmax", "log_space", "num_components", "width"))
        self._sizes = (np.int32(components), np.int32(self.width))
        self._params = {}
        # Compile for the argument types now (a tiny probs tensor has the same type).
        example_probs = torch.zeros((1, 1, self.width), device=env.device)
        self._kernel = self.backend.compile(
            SAMPLE_SPEC, self._arrays_type(*self._fixed, self.backend.view(example_probs)),
            self.params(False, False))
        self._last = (None, None)  # (probs tensor, its arrays tuple): reuse views

    def params(self, argmax: bool, log_space: bool):
        key = (bool(argmax), bool(log_space))
        made = self._params.get(key)
        if made is None:  # four at most, made once: the tuple is built at every draw else
            made = self._params[key] = self._params_type(np.bool_(argmax), np.bool_(log_space),
                                                         *self._sizes)
        return made

    def sample(self, probs: torch.Tensor, argmax: bool = False,
               log_space: bool = False) -> torch.Tensor:
        arrays = self._arrays_for(probs)
        self._kernel(self.env.num_envs, self.env.num_agents, arrays,
                     self.params(argmax, log_space))
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
                             f"(num_envs, num_agents, sampler.width), got {tuple(probs.shape)}")
        arrays = self._arrays_type(*self._fixed, self.backend.view(probs))
        self._last = (probs, arrays)
        return arrays


def agent_tables(env) -> tuple[np.ndarray, np.ndarray]:
    """(nvec, offsets), each (num_agents, most components) int32: agent i's choices per
    component and where each component starts in its row of `probs` (zeros where an
    agent has no such component)."""
    specs = [p for p in env.policy_specs.values() if not p.continuous]
    components = max((len(p.actions) for p in specs), default=1)
    nvec = np.zeros((env.num_agents, components), dtype=np.int32)
    offsets = np.zeros_like(nvec)
    for spec in specs:
        ids = list(spec.agent_ids)
        nvec[ids, :len(spec.actions)] = spec.actions
        offsets[ids, :len(spec.actions)] = np.concatenate([[0], np.cumsum(spec.actions)[:-1]])
    return nvec, offsets
