"""`cudasim`: numba's CUDA simulator runs GPU kernel code as Python on the CPU.

It is slow (thousands of threads per second) and meant for debugging kernels
and testing GPU code paths without a GPU; keep its grids tiny.
"""
import warnings

import numpy as np
import numba.cuda
import torch
from numba.cuda.simulator import jit as sim_jit
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
from numba.cuda.simulator.kernel import _get_kernel_context

from gpusim import kernels
from gpusim.backends.base import GridKernel, ThreadBlockBackend


class _SimulatedCuda:
    """Stands in for `numba.cuda` inside device functions: resolves to the running launch."""

    def __getattr__(self, name):
        context = _get_kernel_context()
        if context is None:
            return getattr(numba.cuda, name)
        return getattr(context, name)


_SWAPS = {numba.cuda: _SimulatedCuda()}


class _SimLaunch:
    """`k[grid, block](*args)`, with arrays passed zero-copy and overflow warnings muted.

    Arrays are wrapped as the simulator's device arrays, so kernels write
    straight into tensor memory (and no CUDA driver is looked for).
    Interpreted uint64 arithmetic (the RNG) wraps as it does on a GPU, but
    numpy warns about it.
    """

    def __init__(self, fn, backend):
        self._kernel = sim_jit(kernels.to_python(fn, _SWAPS))
        self._backend = backend

    def __getitem__(self, config):
        grid, block = config[:2]

        def launch(*args):
            args = [self._wrap(a) for a in args]
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
                self._kernel[grid, block](*args)
        return launch

    def _wrap(self, arg):
        if isinstance(arg, torch.Tensor):
            arg = self._backend.view(arg)
        return FakeCUDAArray(arg) if isinstance(arg, np.ndarray) else arg


class CUDASimBackend(ThreadBlockBackend):
    name = "cudasim"
    device = torch.device("cpu")

    def view(self, tensor):
        return tensor.numpy()

    def _compile(self, spec):
        source, callables = kernels.cuda_source(spec)
        namespace = dict(callables, cuda=numba.cuda, __kernel_name__=spec.name)
        return GridKernel(_SimLaunch(kernels.build(source, namespace), self))

    def raw_kernel(self, fn):
        return _SimLaunch(fn, self)
