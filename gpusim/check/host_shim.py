"""gpusim's CUDA C kernels on the CPU: the host shim, and ThreadSanitizer over it.

`host_shim.cuh` (beside this module) lets a `.cu` file compile with g++ (C++20):
`__global__` and friends compile away, `threadIdx` / `blockIdx` are
thread-local, `__syncthreads()` is a `std::barrier` over the threads of the
running block, and blocks run one after another, one `std::thread` per GPU
thread. Here:

- `build_library`: a kernel file compiled against it into a shared library,
  one launcher per `extern "C" __global__` kernel (`call` launches one);
- `race_check`: kernels run in a standalone program built with
  `-fsanitize=thread`, where the shim's barrier is the only synchronisation,
  so two threads touching one element between two barriers, one writing, is
  reported; `tsan_problem` and `compiler_problem` say why either cannot run.

The public check of an env's CUDA C kernels is gpusim.check.cuda_c_races.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np

from gpusim.backends.cuda_c import C_CTYPES, kernel_signature, kernel_signatures

SHIM_DIR = Path(__file__).resolve().parent  # host_shim.cuh
GXX_FLAGS = ("-std=c++20", "-pthread", "-O1", "-fPIC", "-shared", "-ffp-contract=off",
             "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror")

_PYTHON = {ctypes.c_float: float, ctypes.c_double: float, ctypes.c_bool: bool}


def find_gxx() -> str | None:
    return shutil.which("g++")


def compiler_problem(build_dir: Path) -> str | None:
    """Why the host shim cannot be built here (no g++, or no C++20 <barrier>), else None."""
    gxx = find_gxx()
    if gxx is None:
        return "g++ was not found"
    probe = Path(build_dir) / "probe.cpp"
    probe.write_text('#include "host_shim.cuh"\nstatic void k() { __syncthreads(); }\n'
                     'extern "C" int probe() { return gpusim_host::launch(1, 2, &k); }\n')
    result = subprocess.run([gxx, *GXX_FLAGS, "-I", str(SHIM_DIR), "-o",
                             str(probe.with_suffix(".so")), str(probe)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        return f"g++ cannot build the C++20 host shim:\n{result.stderr.strip()}"
    return None


def build_library(source: str, name: str, build_dir: Path, dirs: list = (),
                  generated: list | None = None):
    """Compile kernel source text with the host shim; the loaded library (ctypes.CDLL).

    `dirs` are searched for its includes; `generated` is the parameter list of
    its GPUSIM_ENV_PARAMS, if it uses it. Each kernel's launcher gets its
    `argtypes` from the C signature.
    """
    build_dir = Path(build_dir)
    kernel_file = build_dir / name
    kernel_file.write_text(source)
    signatures = kernel_signatures(source, generated)
    lines = ['#include "host_shim.cuh"', f'#include "{name}"', ""]
    for function, params in signatures.items():
        declared = "".join(f", {p.ctype}{'*' if p.pointer else ''} {p.name}" for p in params)
        passed = "".join(f", {p.name}" for p in params)
        lines += [f'extern "C" int gpusim_host_launch_{function}(unsigned int grid, '
                  f'unsigned int block{declared})',
                  f"{{ return gpusim_host::launch(grid, block, &{function}{passed}); }}", ""]
    wrapper = build_dir / f"{Path(name).stem}_host.cpp"
    wrapper.write_text("\n".join(lines))
    library = build_dir / f"lib{Path(name).stem}_host.so"
    command = [find_gxx(), *GXX_FLAGS, "-I", str(SHIM_DIR), "-I", str(build_dir),
               *(x for d in dirs for x in ("-I", str(d)))]
    command += ["-o", str(library), "-x", "c++", str(wrapper)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"g++ could not build {name} with the host shim:\n"
                           f"{result.stderr.strip()}")
    lib = ctypes.CDLL(str(library))
    for function, params in signatures.items():
        entry = getattr(lib, f"gpusim_host_launch_{function}")
        entry.argtypes = [ctypes.c_uint, ctypes.c_uint] + [
            ctypes.c_void_p if p.pointer else C_CTYPES[p.ctype] for p in params]
        entry.restype = ctypes.c_int
    return lib


def call(lib, function: str, grid: int, block: int, *args):
    """Launch `function` of a host library; raise if its threads passed different barriers."""
    entry = getattr(lib, f"gpusim_host_launch_{function}")
    converted = [_PYTHON.get(kind, int)(value) for kind, value in zip(entry.argtypes[2:], args)]
    failed = entry(grid, block, *converted)
    if failed:
        raise AssertionError(f"{function}: the threads of block {failed - 1} passed different "
                             "numbers of __syncthreads() (a barrier in divergent code)")


def race_check(source: str, name: str, launches, grid: int, block: int, build_dir: Path,
               dirs: list = (), repeats: int = 1, generated: list | None = None) -> str:
    """Run kernels under ThreadSanitizer on copies of their arguments; its reports ("" if none).

    `launches` lists (function, arrays, scalars): numpy arrays for the
    kernel's pointers and numpy scalars for the rest, in its parameter order.
    Each runs `repeats` times, in order, in one standalone program built with
    -fsanitize=thread, where the std::barrier behind __syncthreads() is the
    only synchronisation between threads: two threads touching one element
    between two barriers, one of them writing, is reported.
    """
    build_dir = Path(build_dir)
    (build_dir / name).write_text(source)
    lines = ['#include "host_shim.cuh"', f'#include "{name}"', "#include <fstream>",
             "#include <vector>", "",
             "static std::vector<unsigned long long> load(const char* path, std::size_t bytes)",
             "{", "    std::vector<unsigned long long> data(bytes / 8 + 1);",
             "    std::ifstream(path, std::ios::binary).read((char*)data.data(), bytes);",
             "    return data;", "}", "", "int main()", "{"]
    for n, (function, arrays, scalars) in enumerate(launches):
        params = kernel_signature(source, function, name, generated)
        args, k = [], 0
        for param, value in zip(params, list(arrays) + list(scalars)):
            if param.pointer:
                path = build_dir / f"{Path(name).stem}_{n}_arg{k}.bin"
                path.write_bytes(value.tobytes())
                lines.append(f'    auto a{n}_{k} = load("{path}", {value.nbytes});')
                args.append(f"({param.ctype}*)a{n}_{k}.data()")
                k += 1
            elif param.ctype == "bool":
                args.append("true" if value else "false")
            elif param.ctype in ("float", "double"):
                args.append(float(value).hex() + ("f" if param.ctype == "float" else ""))
            else:
                args.append(f"({param.ctype}){int(value)}")
        lines += [f"    for (int r = 0; r < {repeats}; ++r)",
                  f"        if (gpusim_host::launch({grid}, {block}, &{function}, "
                  f"{', '.join(args)}))",
                  f"            return {10 + n};"]
    lines += ["    return 0;", "}"]
    program = build_dir / f"{Path(name).stem}_race.cpp"
    program.write_text("\n".join(lines))
    executable = program.with_suffix("")
    command = [find_gxx(), *[f for f in GXX_FLAGS if f not in ("-shared", "-fPIC")], "-g",
               "-fsanitize=thread", "-I", str(SHIM_DIR), "-I", str(build_dir),
               *(x for d in dirs for x in ("-I", str(d)))]
    result = subprocess.run(command + ["-o", str(executable), str(program)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"g++ -fsanitize=thread could not build {program.name}:\n"
                           f"{result.stderr.strip()}")
    run = subprocess.run([str(executable)], capture_output=True, text=True,
                         env={"TSAN_OPTIONS": "exitcode=66"})
    if 10 <= run.returncode < 10 + len(launches):
        return (f"{launches[run.returncode - 10][0]}: threads passed different numbers of "
                "__syncthreads()")
    if run.returncode != 0 or "ThreadSanitizer" in run.stderr:
        return run.stderr.strip() or f"the race check exited with {run.returncode}"
    return ""


def tsan_problem(build_dir: Path) -> str | None:
    """Why ThreadSanitizer cannot run the host shim here, else None."""
    probe = '''extern "C" __global__ void probe(int* v) { v[threadIdx.x] = 1; __syncthreads(); }'''
    try:
        report = race_check(probe, "tsan_probe.cu", [("probe", [np.zeros(4, np.int32)], [])],
                            1, 4, Path(build_dir))
    except (RuntimeError, OSError) as exc:
        return f"ThreadSanitizer is unavailable ({exc})"
    return f"ThreadSanitizer misreports a race-free kernel:\n{report}" if report else None
