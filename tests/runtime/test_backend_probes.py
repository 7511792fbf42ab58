"""Backend plumbing a CPU can check: resource errors of every binding, the numba probe
behind `auto`, register-capped kernel variants and the launch-object caches.

The GPU bindings' exception classes are built as stand-ins with the real class
names (which is how `is_resource_error` matches them where they cannot be
imported), and the real ones too where they import here.
"""
import types

import pytest
import torch

from gpusim.backends import base, cuda_works, get_backend, probe
from gpusim.backends.base import is_resource_error, set_build_once
from gpusim.errors import BackendError, NotEnoughMemory


def stand_in(name: str, base_class=Exception, **attributes):
    return type(name, (base_class,), attributes)


# ---- resource errors ---------------------------------------------------------------------------
CudaAPIError = stand_in("CudaAPIError", __init__=lambda self, code, msg: (
    setattr(self, "code", code), Exception.__init__(self, f"[{code}] {msg}"))[-1])
CUDAError = stand_in("CUDAError")  # cuda.core, as numba-cuda 0.30 raises it
PycudaError = stand_in("Error")
PycudaLaunchError = stand_in("LaunchError", PycudaError)
PycudaMemoryError = stand_in("MemoryError", PycudaError)  # pycuda's, not the builtin

RESOURCE = [
    CudaAPIError(701, "Call to cuLaunchKernel results in CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
    CudaAPIError(2, "Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY"),
    CUDAError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: This indicates that a launch did not occur "
              "because it did not have appropriate resources."),
    CUDAError("CUDA_ERROR_OUT_OF_MEMORY: out of memory"),
    BackendError("CUDA driver call cuLaunchKernel failed (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)"),
    PycudaLaunchError("cuLaunchKernel failed: too many resources requested for launch"),
    PycudaMemoryError("cuMemAlloc failed: out of memory"),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: out of memory"),
    MemoryError(),
    NotEnoughMemory("the arrays need 3 GiB, 1 GiB available"),
]
NOT_RESOURCE = [
    CudaAPIError(700, "Call to cuLaunchKernel results in CUDA_ERROR_ILLEGAL_ADDRESS"),
    CUDAError("CUDA_ERROR_INVALID_VALUE: invalid argument"),
    BackendError("CUDA driver call cuModuleLoadData failed (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)"),
    PycudaLaunchError("cuLaunchKernel failed: unspecified launch failure"),
    ValueError("out of memory"),  # not an error a driver binding raises
    KeyError("x"),
]


@pytest.mark.parametrize("exc", RESOURCE, ids=lambda e: f"{type(e).__name__}:{str(e)[:30]}")
def test_resource_errors_of_every_binding_are_failed_trials(exc):
    assert is_resource_error(exc)
    assert get_backend("cpu").is_resource_error(exc)


@pytest.mark.parametrize("exc", NOT_RESOURCE, ids=lambda e: f"{type(e).__name__}:{str(e)[:30]}")
def test_other_errors_abort(exc):
    assert not is_resource_error(exc)


def test_a_resource_error_raised_from_is_found_through_the_chain():
    try:
        try:
            raise CUDAError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources")
        except CUDAError as inner:
            raise RuntimeError("trial failed") from inner
    except RuntimeError as outer:
        assert is_resource_error(outer)


def test_the_real_binding_classes_where_they_import():
    checked = 0
    try:
        from numba.cuda.cudadrv.driver import CudaAPIError as real
        assert is_resource_error(real(701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"))
        assert not is_resource_error(real(700, "CUDA_ERROR_ILLEGAL_ADDRESS"))
        checked += 1
    except ImportError:
        pass
    try:
        from cuda.core._utils.cuda_utils import CUDAError as real
        assert is_resource_error(real("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many"))
        checked += 1
    except ImportError:
        pass
    if not checked:
        pytest.skip("neither numba's CUDA driver module nor cuda.core imports here")


# ---- the probe behind backend auto -------------------------------------------------------------
def test_cuda_works_says_why_not_in_one_line_here():
    ok, why = cuda_works()
    if ok:
        pytest.skip("a CUDA GPU works here")
    assert why and "\n" not in why


@pytest.mark.parametrize("driver, extra", [((12, 4), "gpusim[cuda12]"),
                                           ((13, 0), "gpusim[cuda13]")])
def test_install_hint_follows_the_driver(driver, extra):
    assert extra in probe.install_hint(driver)


def test_install_hint_without_a_driver_says_how_to_choose():
    hint = probe.install_hint(None) if probe.driver_cuda_version() is None else \
        probe.install_hint((11, 8))
    assert "cuda12" in hint and "cuda13" in hint and "nvidia-smi" in hint


@pytest.fixture
def gpu_seen(monkeypatch):
    """numba and torch both 'see' a GPU; what numba then does is up to the test."""
    from numba import cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(probe, "driver_cuda_version", lambda: (12, 2))
    return cuda


def test_auto_skips_numba_that_cannot_compile(gpu_seen, monkeypatch):
    def no_nvvm(*args, **kwargs):
        raise RuntimeError("libNVVM cannot be found. Do `conda install cudatoolkit`")
    monkeypatch.setattr(probe, "numba_cuda_target", lambda: ("numba-cuda 0.30.4", ""))
    monkeypatch.setattr(gpu_seen, "jit", no_nvvm)
    why = probe.numba_problem.__wrapped__()
    assert "cannot compile and launch" in why and "libNVVM" in why
    assert "pip install 'gpusim[cuda12]'" in why and "\n" not in why


def test_auto_skips_numbas_builtin_cuda_target(gpu_seen, monkeypatch):
    monkeypatch.setattr(gpu_seen, "implementation", "Built-in", raising=False)
    why = probe.numba_problem.__wrapped__()
    assert "numba-cuda is not installed" in why and "gpusim[cuda12]" in why


def test_auto_uses_numba_that_compiles_and_launches(gpu_seen, monkeypatch):
    class Launched:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, config):
            return self.fn
    class Array(list):
        def copy_to_host(self):
            return self
    monkeypatch.setattr(probe, "numba_cuda_target", lambda: ("numba-cuda 0.30.4", ""))
    monkeypatch.setattr(gpu_seen, "jit", lambda signature: Launched)  # runs the probe in Python
    monkeypatch.setattr(gpu_seen, "device_array", lambda n, dtype: Array([0] * n))
    assert probe.numba_problem.__wrapped__() is None


# ---- numba kernels: register-capped variants and cached launch objects ------------------------
class FakeDispatcher:
    def __init__(self, cap, log):
        self.cap, self.log = cap, log

    def compile(self, signature):
        self.log.append(("compile", self.cap))

    def __getitem__(self, config):
        grid, block, stream = config
        return lambda s, p: self.log.append(("launch", self.cap, grid, block, stream))


def test_numba_kernel_compiles_one_variant_per_register_cap(monkeypatch):
    from gpusim.backends.numba_cuda import CUDAKernel
    log, events = [], []
    backend = types.SimpleNamespace(stream=lambda: "stream")
    kernel = CUDAKernel(lambda cap: FakeDispatcher(cap, log), backend, "env.step")
    set_build_once(lambda event, build: (events.append(event), build())[1])
    try:
        kernel.precompile(1, 2)
        kernel(4, 110, 1, 2)
        kernel(4, 1024, 1, 2)
        kernel(8, 1024, 1, 2)
        kernel(4, 300, 1, 2)
    finally:
        set_build_once(None)
    assert log == [("compile", None), ("launch", None, 4, 110, "stream"),
                   ("compile", 64), ("launch", 64, 4, 1024, "stream"),
                   ("launch", 64, 8, 1024, "stream"),
                   ("compile", 200), ("launch", 200, 4, 300, "stream")]
    assert events == ["compile numba env.step max_registers=64",
                      "compile numba env.step max_registers=200"]


def test_numba_backend_makes_one_stream_object_per_torch_stream(monkeypatch):
    from gpusim.backends import numba_cuda
    handles = iter([7, 7, 9, 7])
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device: types.SimpleNamespace(cuda_stream=next(handles)))
    made = []
    monkeypatch.setattr(numba_cuda.cuda, "external_stream",
                        lambda handle: made.append(handle) or object())
    backend = object.__new__(numba_cuda.NumbaCUDABackend)
    backend.device, backend._streams = torch.device("cuda", 0), {}
    first, again, other, back = (backend.stream() for _ in range(4))
    assert first is again is back and other is not first
    assert made == [7, 9]


def test_build_once_runs_through_the_hook_when_installed():
    events = []
    assert base.build_once("e", lambda: 3) == 3
    set_build_once(lambda event, build: (events.append(event), build())[1])
    try:
        assert base.build_once("compile x", lambda: 4) == 4
    finally:
        set_build_once(None)
    assert events == ["compile x"]


def test_cuda_bindings_launch_prepares_types_once_and_one_stream_per_torch_stream(monkeypatch):
    """The cuda-bindings driver against a stand-in driver API: the argument types come from
    `prepare`, pointers are passed as addresses, a stream object is made once per stream."""
    import ctypes
    from gpusim.backends.cuda_c import CParam
    from gpusim.backends.cuda_c_backend import CudaBindingsDriver
    launches, streams = [], []
    success = object()
    fake = types.SimpleNamespace(
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=success),
        cuCtxSetCurrent=lambda context: (success,),
        CUstream=lambda handle: streams.append(handle) or f"stream{handle}",
        cuLaunchKernel=lambda *a: launches.append(a) or (success,))
    driver = object.__new__(CudaBindingsDriver)
    driver.driver, driver.context, driver._streams = fake, "ctx", {}
    driver.device = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device: types.SimpleNamespace(cuda_stream=5))
    prepared = driver.prepare(None, [CParam("obs", "float", True), CParam("n", "int", False)],
                              "Pi")
    assert prepared == (ctypes.c_void_p, ctypes.c_int)
    for _ in range(2):
        driver.launch(("module", "function"), 8, 32, prepared, (0x1000, 7))
    assert streams == [5]
    assert launches[0] == ("function", 8, 1, 1, 32, 1, 1, 0, "stream5",
                           ((0x1000, 7), prepared), 0)
