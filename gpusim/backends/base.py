"""The backend interface, and the compile cache shared by all backends."""
from __future__ import annotations

import torch

from gpusim import kernels
from gpusim.errors import ArrayError, BackendError


class Backend:
    """Compiles portable kernels and launches them on zero-copy array views.

    Subclasses set `name`, `device`, `max_agents_per_env` (the block-size
    limit, or None) and implement `view`, `_compile` and `_launch_raw`.
    """
    name: str = ""
    device: torch.device = torch.device("cpu")
    max_agents_per_env: int | None = None
    _compiled: dict = {}  # (backend kind, KernelSpec) -> compiled kernel; per process

    # ---- arrays -------------------------------------------------------------
    def view(self, tensor: torch.Tensor):
        """A zero-copy view of `tensor` that kernels of this backend can index."""
        raise NotImplementedError

    def check_tensor(self, name: str, tensor: torch.Tensor):
        if not isinstance(tensor, torch.Tensor):
            raise ArrayError(f"array '{name}' must be a torch tensor, got {type(tensor).__name__}")
        if tensor.device != self.device:
            raise ArrayError(f"array '{name}' is on {tensor.device}, expected {self.device}")
        if not tensor.is_contiguous():
            raise ArrayError(f"array '{name}' must be contiguous")

    # ---- portable kernels ---------------------------------------------------
    def check_num_agents(self, num_agents: int):
        limit = self.max_agents_per_env
        if limit is not None and num_agents > limit:
            raise BackendError(
                f"{num_agents} agents per replica exceed the {self.name} backend's "
                f"block-size limit of {limit} threads; use fewer agents per replica")

    def compile(self, spec: kernels.KernelSpec):
        """A callable `launch(num_envs, num_agents, s, p)` for `spec`, compiled once per process."""
        key = (type(self).__name__, spec)
        if key not in Backend._compiled:
            Backend._compiled[key] = self._compile(spec)
        return Backend._compiled[key]

    def _compile(self, spec: kernels.KernelSpec):
        raise NotImplementedError

    # ---- raw kernels --------------------------------------------------------
    def raw_kernel(self, fn):
        """Launchable `k[grid, block](*args)` for a raw numba CUDA kernel; tensors are viewed."""
        raise BackendError(f"backend '{self.name}' does not run raw CUDA kernels; "
                           "use backend 'numba' or 'cudasim', or write portable phases")

    def synchronize(self):
        pass

    def __repr__(self):
        return f"<gpusim backend {self.name} on {self.device}>"
