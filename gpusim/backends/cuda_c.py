"""The CUDA C toolchain of the `cuda_c` backend: compiling; it needs neither a GPU nor pycuda.

- Compilers: NVRTC (NVIDIA's `cuda-bindings` wheels, no toolkit; or a
  libnvrtc of any CUDA major loaded by path) or nvcc; `find_compiler` picks
  one ($GPUSIM_CUDA_COMPILER, else NVRTC where it imports, else nvcc).
- `build` compiles a source for one argument layout into the compile cache,
  keyed by the source, every header it includes, the generated header, the
  architecture and the compiler.

Finding kernel files, the generated argument header and the signature checks
are in gpusim.backends.cuda_c_sources; their names are importable from here
too, as the toolchain's one namespace.
"""
from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

# the toolchain's names from before the split, importable from here as they were
from gpusim.backends.cuda_c_sources import (  # noqa: F401
    C_CTYPES, C_TYPES, GENERATED_HEADER, PARAMS_MACRO, CParam, TensorPointer, args_header,
    argument_format, env_args_header, header_params, include_dirs, included_headers,
    kernel_dir, kernel_signature, kernel_signatures, kernel_source, launch_signature, locate,
    split_cuda_c)
from gpusim.errors import BackendError

# Options of every compile (nvcc and NVRTC alike): no contraction of a * b + c
# into one fused multiply-add, so float32 results round as in the portable kernels.
NVCC_FLAGS = ("--fmad=false",)


# ---- compilers ------------------------------------------------------------------------------
COMPILER_VARIABLE = "GPUSIM_CUDA_COMPILER"  # nvrtc or nvcc; default: NVRTC where it imports
INSTALL_COMPILER = ("install NVRTC with `pip install gpusim[cuda12]` or `gpusim[cuda13]` (the driver's CUDA major) (wheels, no toolkit), or "
                    "the CUDA toolkit for nvcc")


def find_tool(name: str) -> str | None:
    """A CUDA toolkit program (nvcc, ptxas) on PATH, else under $CUDA_HOME or $CUDA_PATH,
    else in the toolkit's default prefix."""
    found = shutil.which(name)
    if found:
        return found
    prefixes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                os.path.join(os.sep, "usr", "local", "cuda")]
    for prefix in filter(None, prefixes):
        candidate = Path(prefix) / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_nvcc() -> str | None:
    return find_tool("nvcc")


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    result = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    if result.returncode != 0:
        raise BackendError(f"'{nvcc} --version' failed: {result.stderr.strip()}")
    return result.stdout.strip()


def nvcc_command(nvcc: str, arch: str, source: Path, output: Path, kind: str = "-cubin",
                 dirs: list | None = None) -> list:
    """The nvcc command line that compiles `source` to a cubin (or `--ptx`) for `arch`."""
    includes = [x for d in (dirs if dirs is not None else [kernel_dir()]) for x in ("-I", str(d))]
    return [nvcc, kind, f"-arch={arch}", *NVCC_FLAGS, *includes, "-o", str(output), str(source)]


class Nvcc:
    """The CUDA toolkit's compiler, as a subprocess."""
    name = "nvcc"

    def __init__(self, path: str):
        self.path = path

    def identity(self) -> str:
        return nvcc_version(self.path)

    def compile(self, source: Path, dirs: list, arch: str, output: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="gpusim-nvcc-") as tmp:
            out = Path(tmp) / f"kernel.{output}"
            kind = "-cubin" if output == "cubin" else "--ptx"
            result = subprocess.run(nvcc_command(self.path, arch, source, out, kind, dirs),
                                    capture_output=True, text=True)
            if result.returncode != 0:
                raise BackendError(f"nvcc could not compile {source.name} for {arch}:\n"
                                   f"{(result.stderr or result.stdout).strip()}")
            return out.read_bytes()


class Nvrtc:
    """NVIDIA's runtime compiler, through the `cuda-bindings` wheels: no toolkit needed; or,
    with `library`, one libnvrtc of any CUDA major loaded directly (`NvrtcLibrary`)."""
    name = "nvrtc"

    def __init__(self, library: str | None = None):
        if library is None:
            from cuda.bindings import nvrtc  # ImportError: not installed
        else:
            nvrtc = NvrtcLibrary(library)
        self.nvrtc = nvrtc
        self.identity()  # the NVRTC library itself must load too

    def identity(self) -> str:
        major, minor = self._checked(self.nvrtc.nvrtcVersion(), "nvrtcVersion")
        return f"nvrtc {major}.{minor}"

    def _checked(self, result, what: str, program=None):
        error, *values = result
        if error != self.nvrtc.nvrtcResult.NVRTC_SUCCESS:
            log = self._log(program) if program is not None else ""
            raise BackendError(f"NVRTC {what} failed ({getattr(error, 'name', error)})"
                               f"{':' if log else ''}\n{log}"
                               .rstrip())
        return values

    def _log(self, program) -> str:
        (size,) = self._checked(self.nvrtc.nvrtcGetProgramLogSize(program), "log size")
        log = _out_buffer(size)
        self._checked(self.nvrtc.nvrtcGetProgramLog(program, log), "log")
        return log.decode(errors="replace").rstrip("\x00 \n")

    def compile(self, source: Path, dirs: list, arch: str, output: str) -> bytes:
        return self.compile_with_log(source, dirs, arch, output)[0]

    def compile_with_log(self, source: Path, dirs: list, arch: str, output: str,
                         options: tuple = ()) -> tuple[bytes, str]:
        """(the image, NVRTC's log) of `source` for `arch`; `options` are added (e.g.
        `--ptxas-options=-v` for a cubin: the log then holds registers and spills)."""
        nvrtc = self.nvrtc
        target = arch if output == "cubin" else arch.replace("sm_", "compute_")
        options = [f"--gpu-architecture={target}", *NVCC_FLAGS, "--std=c++17",
                   *(f"--include-path={d}" for d in dirs), *options]
        (program,) = self._checked(nvrtc.nvrtcCreateProgram(
            source.read_bytes(), source.name.encode(), 0, [], []), "create")
        try:
            error, = nvrtc.nvrtcCompileProgram(program, len(options),
                                               [o.encode() for o in options])
            if error != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                raise BackendError(f"NVRTC could not compile {source.name} for {target}:\n"
                                   f"{self._log(program)}")
            get_size, get = ((nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if output == "cubin"
                             else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX))
            (size,) = self._checked(get_size(program), f"{output} size")
            image = _out_buffer(size)
            self._checked(get(program, image), output)
            return image[:size], self._log(program)
        finally:
            nvrtc.nvrtcDestroyProgram(program)


def _out_buffer(size: int) -> bytes:
    """A fresh bytes object for NVRTC to write `size` bytes into (cuda-bindings' convention).

    Never shorter than 2: Python shares one object for each 1-byte and the empty bytes, and
    NVRTC writing an empty log's NUL into the shared b" " breaks every later use of it
    (torch.save and torch.load among them).
    """
    return b" " * max(size, 2)


class NvrtcLibrary:
    """The few NVRTC calls `Nvrtc` makes, with cuda-bindings' calling convention (a tuple of
    the result, then the values), on a libnvrtc loaded by path through ctypes: NVRTC 12 and
    13 side by side in one environment (cuda-bindings loads only its own major)."""

    class nvrtcResult:  # noqa: N801 (cuda-bindings' name)
        NVRTC_SUCCESS = 0

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)

    def _call(self, name: str, *args):
        return getattr(self.lib, name)(*args)

    def nvrtcVersion(self):  # noqa: N802
        major, minor = ctypes.c_int(), ctypes.c_int()
        return self._call("nvrtcVersion", ctypes.byref(major), ctypes.byref(minor)), \
            major.value, minor.value

    def nvrtcCreateProgram(self, source, name, count, headers, include_names):  # noqa: N802
        program = ctypes.c_void_p()
        return self._call("nvrtcCreateProgram", ctypes.byref(program), source, name, 0, None,
                          None), program

    def nvrtcCompileProgram(self, program, count, options):  # noqa: N802
        array = (ctypes.c_char_p * count)(*options)
        return (self._call("nvrtcCompileProgram", program, count, array),)

    def _size(self, name, program):
        size = ctypes.c_size_t()
        return self._call(name, program, ctypes.byref(size)), size.value

    def _get(self, name, program, buffer: bytes):
        out = ctypes.create_string_buffer(len(buffer))
        result = self._call(name, program, out)
        ctypes.memmove(buffer, out, len(buffer))  # into the caller's buffer, as cuda-bindings
        return (result,)

    def nvrtcGetProgramLogSize(self, program):  # noqa: N802
        return self._size("nvrtcGetProgramLogSize", program)

    def nvrtcGetProgramLog(self, program, buffer):  # noqa: N802
        return self._get("nvrtcGetProgramLog", program, buffer)

    def nvrtcGetPTXSize(self, program):  # noqa: N802
        return self._size("nvrtcGetPTXSize", program)

    def nvrtcGetPTX(self, program, buffer):  # noqa: N802
        return self._get("nvrtcGetPTX", program, buffer)

    def nvrtcGetCUBINSize(self, program):  # noqa: N802
        return self._size("nvrtcGetCUBINSize", program)

    def nvrtcGetCUBIN(self, program, buffer):  # noqa: N802
        return self._get("nvrtcGetCUBIN", program, buffer)

    def nvrtcDestroyProgram(self, program):  # noqa: N802
        return (self._call("nvrtcDestroyProgram", ctypes.byref(program)),)


def nvrtc_libraries() -> dict:
    """{CUDA major: path} of the libnvrtc that NVIDIA's wheels installed (nvidia-cuda-nvrtc-cu12
    in nvidia/cuda_nvrtc, nvidia-cuda-nvrtc 13 in nvidia/cu13), newest file per major."""
    try:
        import nvidia
    except ImportError:
        return {}
    found = {}
    for root in map(Path, getattr(nvidia, "__path__", [])):
        for path in sorted(root.glob("*/lib/libnvrtc.so.*")):
            suffix = path.name.removeprefix("libnvrtc.so.")
            if suffix.isdigit():
                found[int(suffix)] = str(path)
    return found


def find_compiler(choice: str | None = None):
    """The CUDA C compiler to use: `choice`, else $GPUSIM_CUDA_COMPILER, else NVRTC where it
    imports, else nvcc; one error naming what to install when there is none."""
    choice = choice or os.environ.get(COMPILER_VARIABLE) or "auto"
    if choice not in ("auto", "nvrtc", "nvcc"):
        raise BackendError(f"{COMPILER_VARIABLE}={choice!r}: choose nvrtc or nvcc")
    problems = []
    if choice in ("auto", "nvrtc"):
        try:
            return Nvrtc()
        except Exception as exc:  # not installed, or its library does not load
            problems.append(f"NVRTC cannot be used ({type(exc).__name__}: {exc})")
    if choice in ("auto", "nvcc"):
        nvcc = find_nvcc()
        if nvcc is not None:
            return Nvcc(nvcc)
        problems.append("nvcc was not found (not on PATH, nor in $CUDA_HOME/bin)")
    raise BackendError(f"no CUDA C compiler: {'; '.join(problems)}; {INSTALL_COMPILER}")


# ---- building ---------------------------------------------------------------------------------
def build(compiler, source: Path, header: str, arch: str, output: str = "cubin") -> bytes:
    """The compiled image of `source` with generated header `header`, from the compile cache
    or compiled once into it.

    The key covers the source, every header it includes (the generated one
    too), the architecture, the output kind and the compiler's identity.
    """
    from gpusim import cache
    with tempfile.TemporaryDirectory(prefix="gpusim-cuda-c-") as tmp:
        generated = Path(tmp)
        (generated / GENERATED_HEADER).write_text(header)
        dirs = include_dirs(source, generated)
        text = source.read_text()
        headers = included_headers(text, dirs)
        key = [text, *(f"{p.name}\n{t}" for p, t in sorted(headers.items(), key=lambda kv: str(kv[0]))),
               arch, output, compiler.name, compiler.identity(), " ".join(NVCC_FLAGS)]
        path = cache.entry_dir("cuda_c", *key) / f"{source.stem}.{output}"
        if not path.is_file():
            cache.atomic_write(path, compiler.compile(source, dirs, arch, output))
    return path.read_bytes()
