"""Portable kernel mechanics (phases, barriers, guards) and raw numba CUDA kernels."""
import math

import numba
import numpy as np
import pytest
import torch
from numba import cuda

from gpusim import get_backend, kernels
from gpusim.arrays import namedtuple_type
from gpusim.errors import BackendError
from gpusim.kernels import KernelSpec, Section, agent_phase, env_phase


@numba.jit(nopython=True)
def write_ids(env, agent, s, p):
    s.value[env, agent] = env * 100 + agent * p.scale


@numba.jit(nopython=True)
def sum_ids(env, s, p):
    total = 0
    for a in range(s.value.shape[1]):
        total += s.value[env, a]
    s.total[env] = total


@numba.jit(nopython=True)
def read_neighbour(env, agent, s, p):
    # reads another agent's value: correct only after a barrier
    n = s.value.shape[1]
    s.neighbour[env, agent] = s.value[env, (agent + 1) % n] + s.total[env]


@numba.jit(nopython=True)
def is_odd_env(env, s, p):
    return env % 2 == 1


@numba.jit(nopython=True)
def negate(env, agent, s, p):
    s.neighbour[env, agent] = -s.neighbour[env, agent]


SPEC = KernelSpec.of("toy", agent_phase(write_ids), env_phase(sum_ids),
                     agent_phase(read_neighbour), Section((agent_phase(negate),), guard=is_odd_env))


def expected(num_envs, num_agents, scale):
    value = np.array([[e * 100 + a * scale for a in range(num_agents)] for e in range(num_envs)])
    total = value.sum(1)
    neighbour = np.roll(value, -1, axis=1) + total[:, None]
    neighbour[1::2] *= -1
    return value, total, neighbour


@pytest.mark.parametrize("backend_name,num_envs", [("cpu", 3), ("cpu", 2 * kernels.CPU_CHUNK + 5),
                                                  ("cudasim", 3)])
def test_phases_barriers_and_guards(backend_name, num_envs):
    """Every replica runs, in chunks of CPU_CHUNK on the CPU (one partial chunk here)."""
    backend = get_backend(backend_name)
    num_agents = 4
    arrays = {"value": torch.zeros((num_envs, num_agents), dtype=torch.int64),
              "total": torch.zeros(num_envs, dtype=torch.int64),
              "neighbour": torch.zeros((num_envs, num_agents), dtype=torch.int64)}
    views = namedtuple_type("Toy", tuple(arrays))(*(backend.view(t) for t in arrays.values()))
    params = namedtuple_type("ToyParams", ("scale",))(np.int64(3))
    backend.compile(SPEC)(num_envs, num_agents, views, params)
    value, total, neighbour = expected(num_envs, num_agents, 3)
    assert arrays["value"].tolist() == value.tolist()
    assert arrays["total"].tolist() == total.tolist()
    assert arrays["neighbour"].tolist() == neighbour.tolist()


def test_generated_sources_put_barriers_between_phases():
    cuda_src, _ = kernels.cuda_source(SPEC)
    assert cuda_src.count("cuda.syncthreads()") >= 4
    assert "if agent == 0:" in cuda_src and "if run1:" in cuda_src
    cpu_src, _ = kernels.cpu_source(SPEC)
    assert "prange(chunks)" in cpu_src and "if guard1(env, s, p):" in cpu_src


def test_compiled_kernels_are_cached_per_spec():
    backend = get_backend("cpu")
    assert backend.compile(SPEC) is backend.compile(SPEC)


@cuda.jit(device=True)
def block_sum(shared, agent, n):
    cuda.syncthreads()
    if agent == 0:
        total = 0.0
        for k in range(n):
            total += shared[k]
        shared[0] = total
    cuda.syncthreads()
    return shared[0]


def raw_mean_kernel(values, means):
    """A raw numba CUDA kernel with shared memory and a device function."""
    env = cuda.blockIdx.x
    agent = cuda.threadIdx.x
    shared = cuda.shared.array(32, numba.float32)
    shared[agent] = values[env, agent]
    total = block_sum(shared, agent, cuda.blockDim.x)
    if agent == 0:
        means[env] = total / cuda.blockDim.x


def test_raw_kernel_runs_on_cudasim():
    backend = get_backend("cudasim")
    values = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    means = torch.zeros(3, dtype=torch.float32)
    backend.raw_kernel(raw_mean_kernel)[3, 4](values, means)
    assert torch.allclose(means, values.mean(1))
    decorated = cuda.jit(raw_mean_kernel)  # an already-decorated kernel works too
    means.zero_()
    backend.raw_kernel(decorated)[3, 4](values, means)
    assert torch.allclose(means, values.mean(1))


def test_raw_kernel_on_cpu_is_a_clear_error():
    with pytest.raises(BackendError, match="does not run raw CUDA kernels"):
        get_backend("cpu").raw_kernel(raw_mean_kernel)


def test_to_python_swaps_compiled_callees():
    py = kernels.to_python(write_ids)
    assert not hasattr(py, "py_func") and py.__name__ == "write_ids"
    assert math.isclose(py.__code__.co_argcount, 4)
