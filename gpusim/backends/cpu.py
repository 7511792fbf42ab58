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
    # numba's bounds checks: off for runs; check_env's twin of this backend turns them on
    # (its kernels are other cache entries, so a run's kernels are never the checked ones)
    boundscheck = False

    def view(self, tensor):
        return tensor.numpy()

    def _compile(self, spec):
        wrap = "by_reference_checked" if self.boundscheck else "by_reference"
        source, callables = kernels.cpu_source(spec, wrap=wrap)
        # the checked twin runs serially: it compiles in half the time, and check_env's
        # small rollouts gain nothing from threads
        options = dict(boundscheck=True) if self.boundscheck else {}
        parallel = not self.boundscheck
        header, footer = HEADER, DECORATE
        if self.boundscheck:
            header += "\nfrom gpusim.backends.cpu_refs import by_reference_checked"
            footer = footer.replace('error_model="numpy"', 'error_model="numpy", boundscheck=True')
            footer = footer.replace("parallel=True", "parallel=False")
        module = cache.generated_module("cpu", source, callables, header=header,
                                        footer=footer, key_parts=(numba.__version__, FORM))
        if module is not None:
            return CPUKernel(module.kernel)
        namespace = dict(callables, prange=numba.prange, __kernel_name__=spec.name,
                         **{wrap: getattr(cpu_refs, wrap)})
        kernels.build(source, namespace)
        replicas = numba.njit(error_model="numpy", forceinline=True, **options)
        namespace["replicas"] = replicas(namespace["replicas"])
        return CPUKernel(numba.njit(parallel=parallel, error_model="numpy", **options)(
            namespace["kernel"]))

    def _build(self, spec, s, p):
        if not self.boundscheck:
            return super()._build(spec, s, p)
        # every function compiled for the checked kernel checks its indices: the phases and
        # their helpers compile anew for its layout-"A" arrays (cpu_refs)
        saved = numba.core.config.BOUNDSCHECK
        numba.core.config.BOUNDSCHECK = 1
        try:
            return super()._build(spec, s, p)
        finally:
            numba.core.config.BOUNDSCHECK = saved
