"""`numba`: numba CUDA kernels on an NVIDIA GPU, on torch's current stream."""
import numba
import numba.cuda as cuda
import torch

from gpusim import cache, kernels
from gpusim.backends.base import Backend


class _CudaLaunch:
    """`k[grid, block](*args)` on torch's current stream; tensors are viewed zero-copy."""

    def __init__(self, dispatcher, backend):
        self._kernel = dispatcher
        self._backend = backend

    def __getitem__(self, config):
        grid, block = config[:2]
        shared = config[3] if len(config) > 3 else 0

        def launch(*args):
            args = [self._backend.view(a) if isinstance(a, torch.Tensor) else a for a in args]
            self._kernel[grid, block, self._backend.stream(), shared](*args)
        return launch


class CUDAKernel:
    """`launch(num_envs, num_agents, s, p)` as grid = replicas, block = agents."""

    def __init__(self, launcher, dispatcher):
        self.launcher = launcher
        self.dispatcher = dispatcher

    def __call__(self, num_envs, num_agents, s, p):
        self.launcher[num_envs, num_agents](s, p)

    def precompile(self, s, p):
        self.dispatcher.compile((numba.typeof(s), numba.typeof(p)))


class NumbaCUDABackend(Backend):
    name = "numba"
    max_agents_per_env = 1024

    def __init__(self, device_index: int = 0):
        self._raw_dispatchers = {}
        self.device = torch.device("cuda", device_index)
        torch.cuda.set_device(self.device)
        cuda.select_device(device_index)

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
        return CUDAKernel(_CudaLaunch(dispatcher, self), dispatcher)

    def is_resource_error(self, exc):
        from numba.cuda.cudadrv.driver import CudaAPIError
        if isinstance(exc, CudaAPIError):
            return any(word in str(exc) for word in ("OUT_OF_MEMORY", "OUT_OF_RESOURCES"))
        return super().is_resource_error(exc)

    def free_memory(self):
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()

    def raw_kernel(self, fn):
        if hasattr(fn, "configure") or hasattr(fn, "specialize"):
            return _CudaLaunch(fn, self)
        if fn not in self._raw_dispatchers:  # jit a plain function once, not per call
            self._raw_dispatchers[fn] = cuda.jit(fn)
        return _CudaLaunch(self._raw_dispatchers[fn], self)

    def synchronize(self):
        torch.cuda.synchronize(self.device)
