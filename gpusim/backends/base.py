"""The backend interface, and the compile cache shared by all backends."""
from __future__ import annotations

import torch

from gpusim import kernels
from gpusim.errors import ArrayError, BackendError, GpusimError
from gpusim.messenger import current as current_messenger


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

    def compile(self, spec: kernels.KernelSpec, s=None, p=None):
        """A callable `launch(num_envs, num_agents, s, p)` for `spec`, compiled once.

        Once per process (kept in memory), and once per machine where the
        backend caches on disk. In a multi-process run rank 0 compiles first
        (for the types of the example arguments `s` and `p`, when given) and
        the other ranks wait for it, then load its result from the cache.
        """
        key = (type(self).__name__, spec)
        if key not in Backend._compiled:
            def build():
                try:
                    launch = self._compile(spec)
                    if s is not None and hasattr(launch, "precompile"):
                        launch.precompile(s, p)
                    return launch
                except GpusimError:
                    raise
                except Exception as exc:
                    raise BackendError(f"compiling kernel '{spec.name}' for the {self.name} "
                                       f"backend failed: {type(exc).__name__}: {exc}") from None
            messenger = current_messenger()
            if messenger is None:
                Backend._compiled[key] = build()
            else:
                Backend._compiled[key] = messenger.once(f"compile {self.name} {spec.name}", build)
        return Backend._compiled[key]

    def _compile(self, spec: kernels.KernelSpec):
        raise NotImplementedError

    # ---- failures -------------------------------------------------------------
    def is_resource_error(self, exc: BaseException) -> bool:
        """Whether `exc` means "too big for this device" (out of memory, launch resources).

        Auto-scaling counts these as a failed trial and goes on; anything else aborts.
        """
        if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
            return True
        text = str(exc).lower()
        return isinstance(exc, RuntimeError) and any(
            phrase in text for phrase in ("out of memory", "can't allocate memory",
                                          "cannot allocate memory"))

    def free_memory(self):
        """Return cached allocations to the device after a failed trial."""

    # ---- raw kernels --------------------------------------------------------
    def raw_kernel(self, fn):
        """Launchable `k[grid, block](*args)` for a raw numba CUDA kernel; tensors are viewed."""
        raise BackendError(f"backend '{self.name}' does not run raw CUDA kernels; "
                           "use backend 'numba' or 'cudasim', or write portable phases")

    def synchronize(self):
        pass

    def __repr__(self):
        return f"<gpusim backend {self.name} on {self.device}>"
