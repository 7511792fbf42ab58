"""`cpu`: portable kernels as numba `njit(parallel=True)` loops over replicas.

Kernels are cached on disk (gpusim.cache), so a second process, or a second
run, loads machine code in milliseconds instead of compiling for seconds.
"""
import numba
import torch

from gpusim import cache, kernels
from gpusim.backends.base import Backend, Kernel

DECORATE = 'kernel = njit(parallel=True, error_model="numpy", cache=True)(kernel)'


class CPUKernel(Kernel):
    """A numba njit kernel over replicas; `precompile(s, p)` compiles for those types."""

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher

    def __call__(self, num_envs, num_agents, s, p):
        self.dispatcher(num_envs, num_agents, s, p)

    def precompile(self, s, p):
        self.dispatcher.compile((numba.int64, numba.int64, numba.typeof(s), numba.typeof(p)))


class CPUBackend(Backend):
    name = "cpu"
    device = torch.device("cpu")

    def view(self, tensor):
        return tensor.numpy()

    def _compile(self, spec):
        source, callables = kernels.cpu_source(spec)
        module = cache.generated_module("cpu", source, callables,
                                        header="from numba import njit, prange",
                                        footer=DECORATE, key_parts=(numba.__version__,))
        if module is not None:
            return CPUKernel(module.kernel)
        namespace = dict(callables, prange=numba.prange, __kernel_name__=spec.name)
        return CPUKernel(numba.njit(parallel=True, error_model="numpy")(
            kernels.build(source, namespace)))
