"""RNG streams: the algorithm, seeding, and identical numbers on every backend."""
import numba
import numpy as np
import torch
from scipy import stats

from gpusim import get_backend, rng
from gpusim.kernels import KernelSpec, agent_phase

MASK = (1 << 64) - 1


def xoroshiro128plus(s0, s1, count):
    """Independent pure-Python xoroshiro128+ (rotations 24, 16, 37)."""
    def rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & MASK
    out = []
    for _ in range(count):
        out.append((s0 + s1) & MASK)
        s1 ^= s0
        s0, s1 = rotl(s0, 24) ^ s1 ^ ((s1 << 16) & MASK), rotl(s1, 37)
    return out


@numba.njit
def draw_u64(states, count):
    out = np.empty(count, dtype=np.uint64)
    for k in range(count):
        out[k] = rng.next_u64(states, 0, 0)
    return out


def test_next_u64_is_xoroshiro128plus():
    states = rng.seed_streams(1, 1, seed=5).numpy()
    s0, s1 = int(states[0, 0, 0]), int(states[0, 0, 1])
    assert [int(v) for v in draw_u64(states, 50)] == xoroshiro128plus(s0, s1, 50)


def test_stream_depends_only_on_seed_replica_agent():
    small = rng.seed_streams(4, 3, seed=11)
    large = rng.seed_streams(9, 3, seed=11)
    assert torch.equal(small, large[:4])
    offset = rng.seed_streams(5, 3, seed=11, env_offset=4)
    assert torch.equal(offset, large[4:])
    flat = large.reshape(-1, 2)
    assert len({tuple(row.tolist()) for row in flat}) == flat.shape[0]  # all distinct
    assert not torch.equal(rng.seed_streams(4, 3, seed=12), small)


@numba.jit(nopython=True)
def draw_uniforms(env, agent, s, p):
    for k in range(s.out.shape[2]):
        s.out[env, agent, k] = rng.uniform(s.rng_state, env, agent)


def run_uniforms(backend_name, num_envs, num_agents, count, seed):
    from gpusim.arrays import namedtuple_type
    backend = get_backend(backend_name)
    states = rng.seed_streams(num_envs, num_agents, seed)
    out = torch.zeros((num_envs, num_agents, count), dtype=torch.float32)
    kernel = backend.compile(KernelSpec.of("uniforms", agent_phase(draw_uniforms)))
    arrays = namedtuple_type("RngTest", ("rng_state", "out"))(backend.view(states),
                                                              backend.view(out))
    kernel(num_envs, num_agents, arrays, ())
    return out, states


def test_same_numbers_on_cpu_and_cudasim():
    cpu_out, cpu_states = run_uniforms("cpu", 2, 3, 5, seed=99)
    sim_out, sim_states = run_uniforms("cudasim", 2, 3, 5, seed=99)
    assert torch.equal(cpu_out, sim_out)
    assert torch.equal(cpu_states, sim_states)


def test_uniform_is_uniform():
    out, _ = run_uniforms("cpu", 64, 16, 100, seed=3)
    values = out.flatten().numpy()
    assert values.min() >= 0 and values.max() < 1
    assert stats.kstest(values, "uniform").pvalue > 1e-3


@numba.njit
def draw_ints(states, n, count):
    out = np.empty(count, dtype=np.int64)
    for k in range(count):
        out[k] = rng.randint(states, 0, 0, n)
    return out


def test_randint_covers_its_range_evenly():
    values = draw_ints(rng.seed_streams(1, 1, seed=4).numpy(), 7, 70000)
    counts = np.bincount(values, minlength=7)
    assert len(counts) == 7
    assert stats.chisquare(counts).pvalue > 1e-3
