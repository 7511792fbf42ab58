"""The CUDA C toolchain of the `cuda_c` backend; it needs neither a GPU nor pycuda.

- Sources: a spec's `cuda_c = "file.cu:function"` is found beside the module
  of the env that names it (relative paths), as given (absolute paths), or
  in `gpusim.cuda_kernels` (gpusim's own kernels and shared headers).
- The argument list is generated, never written by hand: `args_header`
  writes `gpusim_env_args.cuh` from the arrays and scalars actually passed:
  `GPUSIM_ENV_PARAMS` (the kernel's parameter list), `GpusimEnvArgs` (a
  struct with a field per array and scalar) and `GPUSIM_ENV_ARGS` (that
  struct, filled). `gpusim_env.cuh` gives the replica and agent indices, the
  agent's RNG stream and auto-reset.
- Compilers: NVRTC (NVIDIA's `cuda-bindings` wheels, no toolkit) or nvcc;
  `build` compiles a source for one argument layout into the compile cache,
  keyed by the source, every header it includes, the generated header, the
  architecture and the compiler.
- The signature check stays as the safety net: `argument_format` checks the
  kernel's parameters (the generated list, or one written out) against the
  arrays `s` and scalars `p` passed, in order, names and C types.
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from gpusim.errors import BackendError

# Options of every compile (nvcc and NVRTC alike): no contraction of a * b + c
# into one fused multiply-add, so float32 results round as in the portable kernels.
NVCC_FLAGS = ("--fmad=false",)

# C type of a kernel argument -> numpy dtype of the array element or scalar.
C_TYPES = {
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
    "bool": np.dtype(np.bool_),
    "signed char": np.dtype(np.int8),
    "unsigned char": np.dtype(np.uint8),
    "short": np.dtype(np.int16),
    "unsigned short": np.dtype(np.uint16),
    "int": np.dtype(np.int32),
    "unsigned int": np.dtype(np.uint32),
    "long long": np.dtype(np.int64),
    "unsigned long long": np.dtype(np.uint64),
}
_C_ALIASES = {"gpusim_u64": "unsigned long long", "unsigned": "unsigned int",
              "long long int": "long long", "unsigned long long int": "unsigned long long",
              "short int": "short", "unsigned short int": "unsigned short"}
# ctypes type of each scalar C type (for launchers that pack arguments themselves)
C_CTYPES = {"float": ctypes.c_float, "double": ctypes.c_double, "bool": ctypes.c_bool,
            "signed char": ctypes.c_byte, "unsigned char": ctypes.c_ubyte,
            "short": ctypes.c_short, "unsigned short": ctypes.c_ushort, "int": ctypes.c_int,
            "unsigned int": ctypes.c_uint, "long long": ctypes.c_longlong,
            "unsigned long long": ctypes.c_ulonglong}
# struct-module format character of each scalar C type ("P" for pointers)
_STRUCT_CHARS = {"float": "f", "double": "d", "bool": "?", "signed char": "b",
                 "unsigned char": "B", "short": "h", "unsigned short": "H", "int": "i",
                 "unsigned int": "I", "long long": "q", "unsigned long long": "Q"}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict"}
GENERATED_HEADER = "gpusim_env_args.cuh"
PARAMS_MACRO = "GPUSIM_ENV_PARAMS"


# ---- kernel sources -------------------------------------------------------------------
def kernel_dir() -> Path:
    """The directory of the installed `gpusim.cuda_kernels` package (the .cu and .cuh files)."""
    from gpusim import cuda_kernels
    return Path(cuda_kernels.__file__).resolve().parent


def split_cuda_c(spec) -> tuple[str, str]:
    """("file.cu", "function") of a spec's CUDA C kernel; a clear error when it has none."""
    if spec.cuda_c is None:
        env = spec.name.split(".")[0]
        raise BackendError(f"env {env} has no CUDA C kernel (for kernel '{spec.name}'); "
                           "use backend numba or cpu")
    file, sep, function = spec.cuda_c.partition(":")
    if not sep or not file.endswith(".cu") or not function.isidentifier():
        raise BackendError(f"kernel '{spec.name}' names its CUDA C kernel as {spec.cuda_c!r}; "
                           "expected 'file.cu:function'")
    return file, function


def locate(spec) -> tuple[Path, str]:
    """(the .cu file, the function) of a spec's CUDA C kernel.

    A relative path is looked for beside the module of the env that names it
    (`spec.cuda_c_dir`), then in `gpusim.cuda_kernels`; an absolute one is
    taken as it is. A missing file is one error naming every place looked in.
    """
    file, function = split_cuda_c(spec)
    path = Path(file)
    places = [path] if path.is_absolute() else \
        [Path(d) / path for d in (spec.cuda_c_dir, kernel_dir()) if d is not None]
    for place in places:
        if place.is_file():
            return place.resolve(), function
    raise BackendError(f"CUDA C file '{file}' of kernel '{spec.name}' not found (looked in: "
                       f"{', '.join(str(p) for p in places)})")


def kernel_source(file: str) -> str:
    """The text of `file` from the kernel package."""
    path = kernel_dir() / file
    if Path(file).name != file or not path.is_file():
        raise BackendError(f"CUDA C file '{file}' is not in the gpusim.cuda_kernels package "
                           f"({kernel_dir()})")
    return path.read_text()


def include_dirs(source: Path, generated: Path | None = None) -> list:
    """Where a source's `#include "..."` are found: the generated header's directory, the
    source's own directory, then gpusim's shared headers."""
    return [d for d in (generated, source.parent, kernel_dir()) if d is not None]


_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def included_headers(source_text: str, dirs: list, _seen=None) -> dict:
    """{path: text} of every header `source_text` includes with quotes, recursively."""
    seen = {} if _seen is None else _seen
    for name in _INCLUDE.findall(_strip_comments(source_text)):
        found = next((Path(d) / name for d in dirs if (Path(d) / name).is_file()), None)
        if found is not None and found not in seen:
            seen[found] = found.read_text()
            included_headers(seen[found], dirs, seen)
    return seen


# ---- the C signature ---------------------------------------------------------------------
class CParam(NamedTuple):
    """One kernel parameter: its name, its C type (qualifiers dropped), whether it is a pointer."""
    name: str
    ctype: str
    pointer: bool

    def __str__(self):
        return f"{self.ctype}{'*' if self.pointer else ''} {self.name}"


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", " ", source)


_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?'
                     r'(\w+)\s*\(([^)]*)\)')


def kernel_signatures(source: str, generated: list | None = None) -> dict:
    """{function: [CParam, ...]} for every `extern "C" __global__ void` kernel in `source`.

    A kernel whose parameter list is `GPUSIM_ENV_PARAMS` gets `generated`, the
    parameters of the generated header (see `header_params`).
    """
    found = {}
    for match in _KERNEL.finditer(_strip_comments(source)):
        name, text = match.group(1), match.group(2).strip()
        if text == PARAMS_MACRO:
            if generated is None:
                raise BackendError(f"CUDA C kernel {name} takes {PARAMS_MACRO}, which only "
                                   "exists for a launch with an env's arrays and parameters")
            found[name] = list(generated)
            continue
        params = []
        for raw in ([] if text in ("", "void") else text.split(",")):
            pointer = raw.count("*")
            words = [w for w in raw.replace("*", " ").split() if w not in _QUALIFIERS]
            if pointer > 1 or len(words) < 2:
                raise BackendError(f"CUDA C kernel {name}: cannot read parameter '{raw.strip()}' "
                                   "(expected 'type name' or 'type* name')")
            ctype = " ".join(words[:-1])
            params.append(CParam(words[-1], _C_ALIASES.get(ctype, ctype), bool(pointer)))
        found[name] = params
    return found


def kernel_signature(source: str, function: str, file: str = "the source",
                     generated: list | None = None) -> list:
    signatures = kernel_signatures(source, generated)
    if function not in signatures:
        raise BackendError(f"{file} has no kernel `extern \"C\" __global__ void {function}(...)` "
                           f"(kernels found: {', '.join(signatures) or 'none'})")
    return signatures[function]


# ---- the generated argument list ---------------------------------------------------------
def launch_signature(source: Path, function: str, s, p, what: str) -> tuple[str, list, str]:
    """(generated header, the kernel's parameters, their struct format) for launching
    `function` of `source` with arrays `s` and scalars `p`: the signature is checked."""
    header = args_header(s, p, what)
    params = kernel_signature(source.read_text(), function, source.name, header_params(s, p))
    return header, params, argument_format(params, s, p, f"CUDA C kernel {function} "
                                                         f"({source.name})")



def header_params(s, p) -> list:
    """The parameters a kernel takes for arrays `s` and scalars `p`: the argument convention."""
    return ([CParam(name, _c_type_of(value.dtype), True) for name, value in zip(s._fields, s)]
            + [CParam(name, _c_type_of(np.asarray(value).dtype), False)
               for name, value in zip(p._fields, p)])


def env_args_header(env) -> str:
    """The generated header of an env's kernels (to compile one by hand)."""
    return args_header(env.arrays.views, env._params, env.name)  # `what`: for errors only


def args_header(s, p, what: str = "this launch") -> str:
    """The text of `gpusim_env_args.cuh` for arrays `s` and scalars `p` (one text per
    layout, so every kernel of a file compiles once); `what` names them in errors."""
    params = header_params(s, p)
    unknown = [str(x) for x in params if x.ctype not in C_TYPES]
    if unknown:
        raise BackendError(f"{what}: no C type for {', '.join(unknown)}")
    decls = [f"{x.ctype}{'*' if x.pointer else ''} {x.name}" for x in params]
    lines = [f"// {GENERATED_HEADER}: generated by gpusim; do not edit.",
             "// The kernel parameters of the env's arrays (in the order of env.arrays.views),",
             "// then of its scalar parameters (in the order of env.params()).",
             "#pragma once", "",
             f"#define {PARAMS_MACRO} \\",
             ",\\\n".join(f"    {d}" for d in decls), "",
             "struct GpusimEnvArgs {", *(f"    {d};" for d in decls), "};", "",
             "// GpusimEnvArgs filled from the kernel's parameters",
             f"#define GPUSIM_ENV_ARGS (GpusimEnvArgs{{{', '.join(x.name for x in params)}}})",
             "", "// which optional arrays this layout has (gpusim_env.cuh's auto-reset)",
             *(f"#define GPUSIM_HAS_{x.name.upper()} 1" for x in params if x.pointer), ""]
    return "\n".join(lines)


# ---- arguments ------------------------------------------------------------------------------
class TensorPointer(int):
    """A tensor's data address, as a kernel receives it, remembering the tensor's dtype.

    It holds a reference to the tensor, so the memory outlives every launch
    that is given this pointer.
    """

    def __new__(cls, tensor: torch.Tensor):
        if not tensor.is_contiguous():
            raise BackendError("CUDA C kernels take contiguous tensors only")
        obj = super().__new__(cls, tensor.data_ptr())
        obj.tensor = tensor
        obj.dtype = np.dtype(str(tensor.dtype).removeprefix("torch."))
        return obj


def argument_format(params: list, s, p, where: str) -> str:
    """Check the arrays `s` and scalars `p` against a kernel's parameters; their struct format.

    The kernel must take a pointer for every field of `s` in order, then
    every field of `p` in order, with matching names and C types; a
    `BackendError` names the first difference.
    """
    given = [(name, value, True) for name, value in zip(s._fields, s)]
    given += [(name, value, False) for name, value in zip(p._fields, p)]
    rule = ("the kernel takes a pointer for every array (in the order of env.arrays.views), "
            "then every scalar parameter (in the order of env.params())")
    if len(given) != len(params):
        names = ", ".join(name for name, _, _ in given)
        raise BackendError(f"{where} has {len(params)} parameters but is launched with "
                           f"{len(given)} ({names}); {rule}")
    chars = []
    for k, (param, (name, value, is_array)) in enumerate(zip(params, given)):
        dtype = value.dtype if is_array else np.asarray(value).dtype
        if param.ctype not in C_TYPES:
            raise BackendError(f"{where}: parameter {k} '{param}' has an unsupported C type "
                               f"(supported: {', '.join(C_TYPES)})")
        expected = f"{_c_type_of(dtype)}{'*' if is_array else ''} {name}"
        if param.name != name or param.pointer != is_array or C_TYPES[param.ctype] != dtype:
            raise BackendError(f"{where}: parameter {k} is '{param}' but the env passes "
                               f"'{expected}' there; {rule}")
        chars.append("P" if is_array else _STRUCT_CHARS[param.ctype])
    return "".join(chars)


def _c_type_of(dtype) -> str:
    return next((c for c, d in C_TYPES.items() if d == dtype), f"<no C type for {dtype}>")


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
