"""Every kernel launches at every block size the API admits (1,024 agents per replica).

A thread block holds 65,536 registers, so a kernel launches with 1,024 threads
only at 64 registers per thread or fewer; above that the launch fails with
CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES. For every registered env
(`gpusim.envs.env_names()`, so envs added later are covered too) and every
kernel it compiles (reset, step, the action sampler), without a GPU:
- numba: numba-cuda compiles the kernel to PTX for compute_80 and compute_90;
  ptxas -v assembles it with the register cap the numba backend applies to a
  1,024-thread block (`max_registers`);
- CUDA C: NVRTC compiles it (with its generated argument header) to a cubin
  for sm_80 and sm_90, its own ptxas reporting registers (`__launch_bounds__`);
and registers x 1,024 must fit the block. Spills are printed (pytest -s) and
the CUDA C kernels, which are written to avoid them, must have none.
Each part skips, with the reason, where numba-cuda, NVVM, ptxas or NVRTC is absent.
"""
from __future__ import annotations

import re
import subprocess
import types
from contextlib import contextmanager

import numba
import pytest

from gpusim import ActionSampler, cache
from gpusim.backends.base import Backend
from gpusim.backends.cudasim import CUDASimBackend
from gpusim.backends.cuda_c import (GENERATED_HEADER, Nvrtc, args_header, find_tool,
                                    include_dirs, locate)
from gpusim.backends.numba_cuda import REGISTERS_PER_BLOCK, max_registers
from gpusim.backends.probe import numba_cuda_target
from gpusim.envs import env_names, make
from gpusim.kernels import build, cuda_source
from gpusim.sampler import SAMPLE_SPEC

MAX_AGENTS = 1024  # the API's maximum agents per replica (ThreadBlockBackend)
ARCHS = ((8, 0), (9, 0))
# the default suite checks sm_90 (H100/H200); sm_80 behind `slow` (a PTX compile per kernel)
ARCH_CASES = [pytest.param(cc, id=f"sm_{cc[0]}{cc[1]}",
                           marks=pytest.mark.slow if cc != (9, 0) else ()) for cc in ARCHS]
CONFIG_VARIANTS = {"tag_continuous": ({"continuous_actions": True},)}  # besides the defaults


class RecordingBackend(CUDASimBackend):
    """cudasim, recording the (spec, arrays, scalars) of every kernel compiled."""

    def __init__(self):
        self.compiled = []

    def compile(self, spec, s=None, p=None):
        self.compiled.append((spec, s, p))
        return super().compile(spec, s, p)


def every_kernel() -> list:
    """[(id, spec, s, p, runs_cuda_c)] of every kernel an env (or its sampler) compiles, once
    each; runs_cuda_c: the cuda_c backend runs its CUDA C kernel (an env runs on cuda_c only
    where all its kernels have one: tag_continuous's continuous actions do not)."""
    found = {}
    for name in env_names():
        for config in ({}, *CONFIG_VARIANTS.get(name, ())):
            backend = RecordingBackend()
            env = make(name, 1, backend=backend, **config)
            env_cuda_c = all(spec.cuda_c is not None for spec, _, _ in backend.compiled)
            if env.discrete_width:  # an env of Box actions only has no sampler
                ActionSampler(env)
            for spec, s, p in backend.compiled:
                key = (spec.name, numba.typeof(s), numba.typeof(p))
                suffix = "".join(f"-{k}" for k in config)
                runs_cuda_c = spec.cuda_c is not None and (env_cuda_c or spec is SAMPLE_SPEC)
                found.setdefault(key, (f"{spec.name}{suffix}", spec, s, p, runs_cuda_c))
    return list(found.values())


KERNELS = every_kernel()


def test_every_env_and_the_sampler_are_covered():
    names = {kernel_id.split(".")[0] for kernel_id, *_ in KERNELS}
    assert set(env_names()) <= names
    assert any(spec is SAMPLE_SPEC for _, spec, *_ in KERNELS)
    assert {k[0] for k in CUDA_C_KERNELS} >= {"tag_continuous.reset", "tag_continuous.step"}


def test_register_cap_fits_every_block_size():
    assert max_registers(1) is None and max_registers(256) is None  # ptxas's 255 fits
    assert max_registers(1024) == 64
    assert max_registers(672) == 96
    for block in range(257, MAX_AGENTS + 1):
        cap = max_registers(block)
        warps = -(-block // 32)
        assert cap % 8 == 0 and cap * warps * 32 <= REGISTERS_PER_BLOCK


# ---- ptxas --------------------------------------------------------------------------------
class Usage(types.SimpleNamespace):
    registers: int
    spill_stores: int
    spill_loads: int


def parse_ptxas(log: str) -> dict:
    """{entry function: Usage} from ptxas -v output (spills summed over the functions it
    calls, which ptxas lists after it)."""
    usage = {}
    for block in re.split(r"(?=ptxas info\s*: Compiling entry function)", log):
        entry = re.search(r"Compiling entry function '(\w+)'", block)
        if entry is None:
            continue
        registers = re.search(r"Used (\d+) registers", block)
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
        usage[entry.group(1)] = Usage(registers=int(registers.group(1)),
                                      spill_stores=sum(int(a) for a, _ in spills),
                                      spill_loads=sum(int(b) for _, b in spills))
    return usage


def test_parse_ptxas_reads_entries_registers_and_spills():
    log = """ptxas info    : Compiling entry function 'k1' for 'sm_90'
ptxas info    : Function properties for k1
    32 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 32 bytes cumulative stack size
ptxas info    : Function properties for helper
    0 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'k2' for 'sm_90'
ptxas info    : Used 30 registers, used 0 barriers
"""
    usage = parse_ptxas(log)
    assert usage["k1"] == Usage(registers=64, spill_stores=12, spill_loads=16)
    assert usage["k2"] == Usage(registers=30, spill_stores=0, spill_loads=0)


def assert_fits(kernel_id: str, usage: dict, arch: str):
    assert len(usage) == 1, f"{kernel_id}: expected one entry function, ptxas saw {list(usage)}"
    (entry, used), = usage.items()
    print(f"{kernel_id} {arch}: {used.registers} registers, spills {used.spill_stores} B "
          f"stored / {used.spill_loads} B loaded")
    assert used.registers * MAX_AGENTS <= REGISTERS_PER_BLOCK, (
        f"{kernel_id} uses {used.registers} registers per thread on {arch}: a block of "
        f"{MAX_AGENTS} agents needs {used.registers * MAX_AGENTS} > {REGISTERS_PER_BLOCK}")
    return used


# ---- numba ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ptxas():
    found = find_tool("ptxas")
    if found is None:
        pytest.skip("ptxas not found (the CUDA toolkit's bin: not on PATH, nor under "
                    "$CUDA_HOME or /usr/local/cuda)")
    return found


@contextmanager
def compute_capability(cc):
    """numba-cuda compiles a kernel's device functions for the current device's compute
    capability; without a GPU, pretend to have one of `cc`."""
    from numba.cuda import dispatcher
    original = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=cc)
    try:
        yield
    finally:
        dispatcher.get_current_device = original


@pytest.fixture(scope="module")
def numba_ptx():
    """PTX of a portable kernel for an architecture, compiled once into the compile cache
    (keyed by the kernel's source, every function it reaches, its types and numba-cuda)."""
    target, why = numba_cuda_target()
    if target is None:
        pytest.skip(f"compiling numba kernels to PTX needs numba-cuda: {why}")
    from numba import cuda

    def ptx(kernel_id, spec, s, p, cc):
        source, callables = cuda_source(spec)
        signature = (numba.typeof(s), numba.typeof(p))
        path = cache.entry_dir("ptx", source, *map(cache.source_fingerprint, callables.values()),
                               signature, target, cc) / "kernel.ptx"
        if not path.is_file():
            function = build(source, dict(callables, cuda=cuda, __kernel_name__=spec.name))
            try:
                with compute_capability(cc):
                    cache.atomic_write(path, cuda.compile_ptx(function, signature, cc=cc)[0])
            except Exception as exc:
                if "nvvm" in f"{type(exc).__name__} {exc}".lower():
                    pytest.skip(f"numba-cuda cannot find NVVM here: {exc}")
                raise
        return path.read_text()
    return ptx


@pytest.mark.parametrize("cc", ARCH_CASES)
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k[0])
def test_numba_kernel_fits_a_block_of_1024(kernel, cc, numba_ptx, ptxas, tmp_path):
    kernel_id, spec, s, p, _ = kernel
    arch = f"sm_{cc[0]}{cc[1]}"
    path = tmp_path / "kernel.ptx"
    path.write_text(numba_ptx(kernel_id, spec, s, p, cc))
    cap = max_registers(MAX_AGENTS)
    run = subprocess.run([ptxas, "-v", f"-arch={arch}", f"-maxrregcount={cap}", str(path),
                          "-o", str(tmp_path / "kernel.cubin")], capture_output=True, text=True)
    if run.returncode != 0 and "Unsupported .version" in run.stderr:
        pytest.skip(f"this ptxas is older than numba's NVVM: {run.stderr.strip()}")
    assert run.returncode == 0, run.stderr
    assert_fits(kernel_id, parse_ptxas(run.stderr), arch)


# ---- CUDA C ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nvrtc():
    try:
        return Nvrtc()
    except Exception as exc:
        pytest.skip(f"NVRTC cannot be used here ({type(exc).__name__}: {exc})")


CUDA_C_KERNELS = [k[:4] for k in KERNELS if k[4]]


@pytest.mark.parametrize("cc", ARCHS, ids=lambda cc: f"sm_{cc[0]}{cc[1]}")
@pytest.mark.parametrize("kernel", CUDA_C_KERNELS, ids=lambda k: k[0])
def test_cuda_c_kernel_fits_a_block_of_1024_without_spills(kernel, cc, nvrtc, tmp_path):
    kernel_id, spec, s, p = kernel
    arch = f"sm_{cc[0]}{cc[1]}"
    source, function = locate(spec)
    (tmp_path / GENERATED_HEADER).write_text(args_header(s, p, kernel_id))
    _, log = nvrtc.compile_with_log(source, include_dirs(source, tmp_path), arch, "cubin",
                                    ("--ptxas-options=-v",))
    usage = parse_ptxas(log)
    used = assert_fits(kernel_id, {function: usage[function]}, arch)
    assert used.spill_stores == used.spill_loads == 0, f"{kernel_id} spills on {arch}"


def test_a_kernel_needing_more_registers_than_a_block_allows_is_caught():
    """The check itself: 65 registers per thread cannot launch 1,024 threads."""
    with pytest.raises(AssertionError, match="needs 66560"):
        assert_fits("k", {"k": Usage(registers=65, spill_stores=0, spill_loads=0)}, "sm_90")


def test_backend_base_keeps_1024_as_the_maximum():
    from gpusim.backends.base import ThreadBlockBackend
    assert ThreadBlockBackend.max_agents_per_env == MAX_AGENTS
    assert Backend.max_agents_per_env is None
