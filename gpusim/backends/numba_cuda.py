"""`numba`: numba CUDA kernels on an NVIDIA GPU, on torch's current stream.

A block holds at most 65,536 registers, so a kernel that needs many
registers per thread cannot launch with many threads: at ptxas's own limit
a 1,024-agent block would fail with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES. A
portable kernel is therefore compiled once per register cap its launches
need (`max_registers(block)`: none up to 256 threads, 64 at 1,024), the
variant chosen at launch from the block size.
"""
from __future__ import annotations

import importlib.metadata

import numba
import numba.cuda as cuda
import torch

from gpusim import cache, kernels
from gpusim.backends import cuda_works
from gpusim.backends.base import CUDADeviceBackend, Kernel, build_once
from gpusim.errors import BackendError

REGISTERS_PER_BLOCK = 65536  # every compute capability from 5.0 on
REGISTER_UNIT = 8  # a thread's registers are allocated in multiples of 8 (256 per warp)
COMPILER_REGISTER_LIMIT = 255  # ptxas's own maximum per thread


def max_registers(block: int) -> int | None:
    """The registers per thread that let a block of `block` threads launch, or None where
    the compiler's own limit already fits (blocks of up to 256 threads)."""
    threads = -(-block // 32) * 32  # whole warps
    cap = REGISTERS_PER_BLOCK // threads // REGISTER_UNIT * REGISTER_UNIT
    return cap if cap < COMPILER_REGISTER_LIMIT else None


def jit_options(cap: int | None) -> str:
    """The `cuda.jit` keyword arguments of a kernel compiled with register cap `cap`."""
    return "cache=True" if cap is None else f"max_registers={cap}, cache=True"


def numba_cuda_version() -> str:
    """The version of the CUDA target numba uses: numba-cuda's, else numba's built-in one."""
    try:
        return "numba-cuda " + importlib.metadata.version("numba-cuda")
    except importlib.metadata.PackageNotFoundError:
        return "numba " + numba.__version__


class _CudaLaunch:
    """`k[grid, block](*args)` on torch's current stream; tensors are viewed zero-copy."""

    def __init__(self, dispatcher, backend):
        self.dispatcher = dispatcher
        self._backend = backend

    def __getitem__(self, config):
        grid, block = config[:2]
        shared = config[3] if len(config) > 3 else 0
        launcher = self.dispatcher[grid, block, self._backend.stream(), shared]

        def launch(*args):
            launcher(*(self._backend.view(a) if isinstance(a, torch.Tensor) else a
                       for a in args))
        return launch


class CUDAKernel(Kernel):
    """A portable kernel, compiled once per register cap its launches need.

    `jit(cap)` gives a dispatcher of the kernel capped at `cap` registers per
    thread (None: uncapped). `precompile(s, p)` compiles the uncapped one for
    those types; a capped one is compiled (once per run, see `build_once`) at
    the first launch of a block that needs it.
    """

    def __init__(self, jit, backend, name: str):
        self._jit = jit
        self._backend = backend
        self._name = name
        self._dispatchers = {}  # register cap -> dispatcher

    def dispatcher(self, cap: int | None, s=None, p=None):
        if cap not in self._dispatchers:
            def build():
                dispatcher = self._jit(cap)
                if s is not None:
                    dispatcher.compile((numba.typeof(s), numba.typeof(p)))
                return dispatcher
            self._dispatchers[cap] = build() if cap is None else build_once(
                f"compile numba {self._name} max_registers={cap}", build)
        return self._dispatchers[cap]

    def precompile(self, s, p):
        self.dispatcher(None, s, p)

    def __call__(self, num_envs, num_agents, s, p):
        dispatcher = self.dispatcher(max_registers(num_agents), s, p)
        dispatcher[num_envs, num_agents, self._backend.stream()](s, p)


class NumbaCUDABackend(CUDADeviceBackend):
    name = "numba"

    def __init__(self, device_index: int = 0):
        ok, why = cuda_works()
        if not ok:
            raise BackendError(f"backend 'numba' needs a CUDA GPU: {why}; use --backend cpu")
        super().__init__(device_index)
        cuda.select_device(device_index)
        self._raw_dispatchers = {}
        self._streams = {}  # torch stream handle -> numba's stream object for it

    def view(self, tensor):
        return cuda.as_cuda_array(tensor.detach())

    def stream(self):
        """numba's object for torch's current stream, made once per stream: numba caches a
        launch configuration per stream object, so a new object per launch misses it."""
        handle = torch.cuda.current_stream(self.device).cuda_stream
        if handle not in self._streams:
            self._streams[handle] = cuda.external_stream(handle)
        return self._streams[handle]

    def _compile(self, spec):
        source, callables = kernels.cuda_source(spec)
        arch = "sm_%d%d" % cuda.get_current_device().compute_capability

        def jit(cap):
            module = cache.generated_module(
                "numba", source, callables, header="from numba import cuda",
                footer=f"kernel = cuda.jit({jit_options(cap)})(kernel)",
                key_parts=(numba.__version__, numba_cuda_version(), arch))
            if module is not None:
                return module.kernel
            namespace = dict(callables, cuda=cuda, __kernel_name__=spec.name)
            options = {} if cap is None else {"max_registers": cap}
            return cuda.jit(**options)(kernels.build(source, namespace))
        return CUDAKernel(jit, self, spec.name)

    def raw_kernel(self, fn):
        if hasattr(fn, "configure") or hasattr(fn, "specialize"):
            return _CudaLaunch(fn, self)
        if fn not in self._raw_dispatchers:  # jit a plain function once, not per call
            self._raw_dispatchers[fn] = cuda.jit(fn)
        return _CudaLaunch(self._raw_dispatchers[fn], self)
