"""`numba`: numba CUDA kernels on an NVIDIA GPU, on torch's current stream."""
import numba.cuda as cuda
import torch

from gpusim import kernels
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


class NumbaCUDABackend(Backend):
    name = "numba"
    max_agents_per_env = 1024

    def __init__(self, device_index: int = 0):
        self.device = torch.device("cuda", device_index)
        torch.cuda.set_device(self.device)
        cuda.select_device(device_index)

    def view(self, tensor):
        return cuda.as_cuda_array(tensor.detach())

    def stream(self):
        return cuda.external_stream(torch.cuda.current_stream(self.device).cuda_stream)

    def _compile(self, spec):
        source, callables = kernels.cuda_source(spec)
        namespace = dict(callables, cuda=cuda, __kernel_name__=spec.name)
        launcher = _CudaLaunch(cuda.jit(kernels.build(source, namespace)), self)

        def launch(num_envs, num_agents, s, p):
            launcher[num_envs, num_agents](s, p)
        return launch

    def raw_kernel(self, fn):
        dispatcher = fn if hasattr(fn, "configure") or hasattr(fn, "specialize") else cuda.jit(fn)
        return _CudaLaunch(dispatcher, self)

    def synchronize(self):
        torch.cuda.synchronize(self.device)
