"""The backend interface, the compiled-kernel type, and the compile cache shared by all backends."""
from __future__ import annotations

import contextlib
import re
from typing import Callable, TypeVar

import torch

from gpusim import kernels
from gpusim.errors import ArrayError, BackendError, GpusimError, NotEnoughMemory, compile_failed
from gpusim.sizes import format_size

T = TypeVar("T")
BuildOnce = Callable[[str, Callable[[], T]], T]

_build_once: BuildOnce | None = None  # installed by the multi-process layer
# reporter(backend name, kernel name) -> a context manager around each build; installed by
# whoever shows progress (the training CLI), none by default
_compile_reporter: Callable[[str, str], contextlib.AbstractContextManager] | None = None


def set_build_once(hook: BuildOnce | None):
    """hook(event: str, build: Callable[[], T]) -> T runs `build` once per run (rank 0 first, the
    others after it), or None for a lone process (build directly)."""
    global _build_once
    _build_once = hook


def build_once(event: str, build: Callable[[], T]) -> T:
    """`build()`, once per run: through the hook of `set_build_once` where one is installed."""
    return build() if _build_once is None else _build_once(event, build)


# What "too big for this device" says, whichever binding raised it: torch, numba
# (CudaAPIError), numba-cuda 0.30 through cuda.core (CUDAError), cuda-bindings
# (CUresult names, in our BackendError), pycuda (LaunchError, MemoryError).
RESOURCE_ERRORS = ("CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
                   "out of memory", "too many resources requested",
                   "did not have appropriate resources", "can't allocate memory",
                   "cannot allocate memory")
RESOURCE_CODES = (2, 701)  # CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
# exception classes (by name, anywhere in the MRO: the bindings need not import here)
# whose message or code is read
DRIVER_ERRORS = {"RuntimeError", "CudaAPIError", "CudaDriverError", "CudaSupportError",
                 "CUDAError", "LaunchError", "BackendError", "Error", "OutOfMemoryError"}


def is_resource_error(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, means out of memory or out of
    launch resources (auto-scaling counts it as a failed trial, not an abort)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _says_resources(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _says_resources(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names.isdisjoint(DRIVER_ERRORS) and "MemoryError" not in names:
        return False
    try:  # numba's CudaAPIError: an int or a CUresult
        code = int(getattr(exc, "code", -1))
    except (TypeError, ValueError):
        code = -1
    if code in RESOURCE_CODES:
        return True
    text = str(exc).lower()
    return any(phrase.lower() in text for phrase in RESOURCE_ERRORS)


def set_compile_reporter(reporter):
    """reporter(backend name, kernel name) -> a context manager entered around every
    compile (a load from the compile cache too), or None for none."""
    global _compile_reporter
    _compile_reporter = reporter


def kernels_built() -> int:
    """How many kernels this process has compiled or loaded (auto-scale counts them: a
    trial of another size must build none)."""
    return len(Backend._compiled)


def meminfo_bytes(field: str) -> int:
    """A field of Linux's /proc/meminfo, in bytes."""
    try:
        with open("/proc/meminfo") as f:
            match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        match = None
    if match is None:
        raise GpusimError(f"cannot read {field} from /proc/meminfo; give --memory_budget")
    return int(match.group(1)) * 1024


class Kernel:
    """A compiled kernel: `kernel(num_envs, num_agents, s, p)` runs it on arrays s, scalars p."""

    def __call__(self, num_envs: int, num_agents: int, s, p):
        raise NotImplementedError

    def precompile(self, s, p):
        """Compile ahead of the first launch for the types of `s` and `p` (default: nothing)."""


class GridKernel(Kernel):
    """A kernel launched as `launcher[grid, block](s, p)` with grid = replicas, block = agents."""

    def __init__(self, launcher):
        self.launcher = launcher

    def __call__(self, num_envs, num_agents, s, p):
        self.launcher[num_envs, num_agents](s, p)


class Backend:
    """Compiles portable kernels and launches them on zero-copy array views.

    Subclasses set `name`, `device`, `max_agents_per_env` (the block-size
    limit, or None) and implement `view` and `_compile`.
    """
    name: str = ""
    device: torch.device = torch.device("cpu")
    max_agents_per_env: int | None = None
    _compiled: dict = {}  # (backend kind, KernelSpec) -> compiled Kernel; per process

    def __init__(self, device_index: int = 0):
        """A backend on GPU `device_index`; backends that run on the CPU ignore it."""

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

    def compile(self, spec: kernels.KernelSpec, s=None, p=None) -> Kernel:
        """The `Kernel` of `spec`, compiled once.

        Once per process (kept in memory), and once per machine where the
        backend caches on disk. In a multi-process run (see `set_build_once`)
        rank 0 compiles first (for the types of the example arguments `s` and
        `p`, when given) and the other ranks wait for it, then load its result
        from the cache.
        """
        key = (type(self).__name__, spec)
        if key not in Backend._compiled:
            def build():
                report = _compile_reporter or (lambda *names: contextlib.nullcontext())
                with report(self.name, spec.name):
                    return self._build(spec, s, p)
            Backend._compiled[key] = build_once(f"compile {self.name} {spec.name}", build)
        return Backend._compiled[key]

    def _build(self, spec: kernels.KernelSpec, s, p) -> Kernel:
        try:
            kernel = self._compile(spec)
            if s is not None:
                kernel.precompile(s, p)
            return kernel
        except GpusimError:
            raise
        except Exception as exc:
            raise BackendError(compile_failed(spec, self.name, exc)) from None

    def _compile(self, spec: kernels.KernelSpec) -> Kernel:
        raise NotImplementedError

    # ---- failures -------------------------------------------------------------
    def is_resource_error(self, exc: BaseException) -> bool:
        """Whether `exc` means "too big for this device" (out of memory, launch resources).

        Auto-scaling counts these as a failed trial and goes on; anything else aborts.
        """
        return is_resource_error(exc)

    def free_memory(self):
        """Return cached allocations to the device after a failed trial."""

    # ---- memory ---------------------------------------------------------------
    def memory(self) -> tuple[int, int]:
        """(free, total) bytes of this backend's device: here the machine's RAM."""
        return meminfo_bytes("MemAvailable"), meminfo_bytes("MemTotal")

    def check_fits(self, what: str, num_bytes: int):
        """Refuse, before trying, an allocation of `num_bytes` larger than the free memory.

        Raises NotEnoughMemory (a MemoryError, so auto-scaling counts it as a failed
        trial); where the free memory cannot be read, the allocator decides.
        """
        try:
            free, _ = self.memory()
        except GpusimError:
            return
        if num_bytes > free:
            raise NotEnoughMemory(f"{what} needs {format_size(num_bytes)}, "
                                  f"{format_size(free)} available on {self.device}")

    # ---- raw kernels --------------------------------------------------------
    def raw_kernel(self, fn):
        """Launchable `k[grid, block](*args)` for a raw numba CUDA kernel; tensors are viewed."""
        raise BackendError(f"backend '{self.name}' does not run raw CUDA kernels; "
                           "use backend 'numba' or 'cudasim', or write portable phases")

    def synchronize(self):
        pass

    def __repr__(self):
        return f"<gpusim backend {self.name} on {self.device}>"


class ThreadBlockBackend(Backend):
    """A backend that launches grid = replicas, block = agents (one thread per agent)."""
    max_agents_per_env = 1024  # CUDA's limit of threads per block


class CUDADeviceBackend(ThreadBlockBackend):
    """A backend on the CUDA GPU cuda:N, the device torch allocates on in this process."""

    def __init__(self, device_index: int = 0):
        self.device = torch.device("cuda", device_index)
        torch.cuda.set_device(self.device)

    def synchronize(self):
        torch.cuda.synchronize(self.device)

    def free_memory(self):
        self.synchronize()
        torch.cuda.empty_cache()

    def memory(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(self.device)
        # memory torch's allocator holds but does not use is free to this process
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return free + cached, total
