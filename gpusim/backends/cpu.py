"""`cpu`: portable kernels as numba `njit(parallel=True)` loops over replicas."""
import numba
import torch

from gpusim import kernels
from gpusim.backends.base import Backend


class CPUBackend(Backend):
    name = "cpu"
    device = torch.device("cpu")
    max_agents_per_env = None

    def view(self, tensor):
        return tensor.numpy()

    def _compile(self, spec):
        source, callables = kernels.cpu_source(spec)
        namespace = dict(callables, prange=numba.prange, __kernel_name__=spec.name)
        kernel = numba.njit(parallel=True, error_model="numpy")(kernels.build(source, namespace))
        return kernel
