"""Counter-free RNG streams: one xoroshiro128+ state per (replica, agent).

The state lives in a uint64 tensor shaped (num_envs, num_agents, 2) on the
run's device. The step functions below are plain `numba.jit` functions, so
they are callable from CUDA kernels, from CPU prange kernels and (as pure
Python) under the CUDA simulator, giving the same numbers on every backend.

Seeding hashes (seed, replica, agent) with splitmix64, so a stream depends
only on those three numbers (not on how many replicas a run has), and runs as
compiled code: numba's own sequential jump-ahead initialiser is far too slow
for large grids under the simulator.
"""
import numba
import numpy as np
import torch
from numba import uint32, uint64

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@numba.jit(nopython=True)
def _rotl(x, k):
    return (x << uint64(k)) | (x >> uint64(64 - k))


@numba.jit(nopython=True)
def next_u64(states, env, agent):
    """Advance stream (env, agent) by one xoroshiro128+ step; return 64 bits."""
    s0 = uint64(states[env, agent, 0])
    s1 = uint64(states[env, agent, 1])
    result = s0 + s1
    s1 ^= s0
    states[env, agent, 0] = _rotl(s0, 24) ^ s1 ^ (s1 << uint64(16))
    states[env, agent, 1] = _rotl(s1, 37)
    return result


@numba.jit(nopython=True)
def uniform(states, env, agent):
    """A float32 uniform in [0, 1) from the top 24 bits of the next output."""
    bits = uint32(next_u64(states, env, agent) >> uint64(40))
    return numba.float32(bits) * numba.float32(1.0 / 16777216.0)


@numba.jit(nopython=True)
def randint(states, env, agent, n):
    """An integer uniform in [0, n) (n > 0), by multiply-shift on 32 bits."""
    bits = next_u64(states, env, agent) >> uint64(32)
    return numba.int32((bits * uint64(n)) >> uint64(32))


@numba.jit(nopython=True)
def _splitmix64(x):
    z = x + _GOLDEN
    z = (z ^ (z >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> uint64(27))) * uint64(0x94D049BB133111EB)
    return z ^ (z >> uint64(31))


@numba.njit(cache=True)  # (host-side: compiled once, then loaded from the cache)
def _seed_streams(out, seed, env_offset):
    num_envs, num_agents = out.shape[0], out.shape[1]
    base = _splitmix64(uint64(seed))
    for e in range(num_envs):
        env_key = _splitmix64(base ^ uint64(e + env_offset))
        for a in range(num_agents):
            key = _splitmix64(env_key ^ (uint64(a) * _GOLDEN))
            s0 = _splitmix64(key)
            s1 = _splitmix64(s0)
            if s0 == 0 and s1 == 0:  # the all-zero state is a fixed point
                s1 = _GOLDEN
            out[e, a, 0] = s0
            out[e, a, 1] = s1


def seed_streams(num_envs: int, num_agents: int, seed: int, env_offset: int = 0,
                 device="cpu") -> torch.Tensor:
    """RNG states for replicas env_offset .. env_offset+num_envs-1, on `device`."""
    states = np.empty((num_envs, num_agents, 2), dtype=np.uint64)
    _seed_streams(states, np.uint64(seed % 2**64), env_offset)
    return torch.from_numpy(states).to(device)
