"""`numba`: numba CUDA kernels on an NVIDIA GPU, on torch's current stream."""
import numba
import numba.cuda as cuda
import torch

from gpusim import cache, kernels
from gpusim.backends import cuda_works
from gpusim.backends.base import CUDADeviceBackend, GridKernel
from gpusim.errors import BackendError


class _CudaLaunch:
    """`k[grid, block](*args)` on torch's current stream; tensors are viewed zero-copy."""

    def __init__(self, dispatcher, backend):
        self.dispatcher = dispatcher
        self._backend = backend

    def __getitem__(self, config):
        grid, block = config[:2]
        shared = config[3] if len(config) > 3 else 0

        def launch(*args):
            args = [self._backend.view(a) if isinstance(a, torch.Tensor) else a for a in args]
            self.dispatcher[grid, block, self._backend.stream(), shared](*args)
        return launch


class CUDAKernel(GridKernel):
    """A numba CUDA kernel; `precompile(s, p)` compiles it for those types."""

    def precompile(self, s, p):
        self.launcher.dispatcher.compile((numba.typeof(s), numba.typeof(p)))


class NumbaCUDABackend(CUDADeviceBackend):
    name = "numba"

    def __init__(self, device_index: int = 0):
        ok, why = cuda_works()
        if not ok:
            raise BackendError(f"backend 'numba' needs a CUDA GPU: {why}; use --backend cpu")
        super().__init__(device_index)
        cuda.select_device(device_index)
        self._raw_dispatchers = {}

    def view(self, tensor):
        return cuda.as_cuda_array(tensor.detach())

    def stream(self):
        return cuda.external_stream(torch.cuda.current_stream(self.device).cuda_stream)

    def _compile(self, spec):
        source, callables = kernels.cuda_source(spec)
        arch = "sm_%d%d" % cuda.get_current_device().compute_capability
        module = cache.generated_module("numba", source, callables,
                                        header="from numba import cuda",
                                        footer="kernel = cuda.jit(cache=True)(kernel)",
                                        key_parts=(numba.__version__, arch))
        if module is not None:
            dispatcher = module.kernel
        else:
            namespace = dict(callables, cuda=cuda, __kernel_name__=spec.name)
            dispatcher = cuda.jit(kernels.build(source, namespace))
        return CUDAKernel(_CudaLaunch(dispatcher, self))

    def is_resource_error(self, exc):
        from numba.cuda.cudadrv.driver import CudaAPIError
        if isinstance(exc, CudaAPIError):
            return any(word in str(exc) for word in ("OUT_OF_MEMORY", "OUT_OF_RESOURCES"))
        return super().is_resource_error(exc)

    def raw_kernel(self, fn):
        if hasattr(fn, "configure") or hasattr(fn, "specialize"):
            return _CudaLaunch(fn, self)
        if fn not in self._raw_dispatchers:  # jit a plain function once, not per call
            self._raw_dispatchers[fn] = cuda.jit(fn)
        return _CudaLaunch(self._raw_dispatchers[fn], self)
