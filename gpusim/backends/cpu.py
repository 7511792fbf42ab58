"""`cpu`: portable kernels as numba `njit(parallel=True)` loops over chunks of replicas.

A chunk is one call of a function compiled with `forceinline`, so every phase
and helper is inlined into it, and they get the arrays and parameters by
reference (`cpu_refs.by_reference`: one pointer instead of hundreds of words).
Kernels are cached on disk (gpusim.cache), so a second process, or a second
run, loads machine code in milliseconds instead of compiling for seconds.
"""
import numba
import torch

from gpusim import cache, kernels
from gpusim.backends import cpu_refs
from gpusim.backends.base import Backend, Kernel

HEADER = "from numba import njit, prange\nfrom gpusim.backends.cpu_refs import by_reference"
DECORATE = ('replicas = njit(error_model="numpy", forceinline=True, cache=True)(replicas)\n'
            'kernel = njit(parallel=True, error_model="numpy", cache=True)(kernel)')
FORM = 2  # the generated kernel's form, in its cache key: bump when cpu_refs changes


class CPUKernel(Kernel):
    """A numba njit kernel over chunks of replicas (their size picked per call for the
    threads numba has then); `precompile(s, p)` compiles for those types."""

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher

    def __call__(self, num_envs, num_agents, s, p):
        size = kernels.cpu_chunk(num_envs, numba.get_num_threads())
        self.dispatcher(num_envs, num_agents, s, p, size)

    def precompile(self, s, p):
        self.dispatcher.compile((numba.int64, numba.int64, numba.typeof(s), numba.typeof(p),
                                 numba.int64))


class CPUBackend(Backend):
    name = "cpu"
    device = torch.device("cpu")

    def view(self, tensor):
        return tensor.numpy()

    def _compile(self, spec):
        source, callables = kernels.cpu_source(spec, wrap="by_reference")
        module = cache.generated_module("cpu", source, callables, header=HEADER,
                                        footer=DECORATE, key_parts=(numba.__version__, FORM))
        if module is not None:
            return CPUKernel(module.kernel)
        namespace = dict(callables, prange=numba.prange, by_reference=cpu_refs.by_reference,
                         __kernel_name__=spec.name)
        kernels.build(source, namespace)
        replicas = numba.njit(error_model="numpy", forceinline=True)
        namespace["replicas"] = replicas(namespace["replicas"])
        return CPUKernel(numba.njit(parallel=True, error_model="numpy")(namespace["kernel"]))
