"""`python -m gpusim.doctor`: what a GPU user needs to know about this machine, in one table.

The driver and the CUDA version it runs, torch's CUDA build, numba-cuda and
its NVVM, NVRTC, nvcc, pycuda and cuda-bindings, the install that matches the
driver, and for each backend "works" or the one-line reason it does not.
Where a GPU exists, each GPU backend proves itself by building a tiny
tag_continuous env and launching its reset and step kernels. `--json` prints
the same rows as a JSON object. It always exits 0 (a CPU-only machine is a
fine machine; the table says so).
"""
from __future__ import annotations

import importlib.metadata
import json
import platform
import sys

from gpusim.arguments import ArgumentParser
from gpusim.errors import describe

BACKENDS = ("cpu", "numba", "cuda_c", "cudasim")


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def gpu_rows() -> list:
    import torch
    from gpusim.backends import probe
    driver = probe.driver_cuda_version()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    target, why = probe.numba_cuda_target()
    nvvm, nvvm_why = probe.nvvm_library()
    return [
        ("GPUs", ", ".join(gpus) if gpus else "none seen by torch"),
        ("driver CUDA version", f"{driver[0]}.{driver[1]}" if driver else
         "no NVIDIA driver (libcuda does not load)"),
        ("torch", f"{torch.__version__}, " + (f"CUDA {torch.version.cuda} build"
                                              if torch.version.cuda else "CPU build")),
        ("numba", package_version("numba")),
        ("numba CUDA target", target or why),
        ("NVVM", nvvm or f"not found ({nvvm_why})"),
        ("NVRTC", nvrtc_version()),
        ("nvcc", nvcc_version()),
        ("cuda-bindings", package_version("cuda-bindings")),
        ("pycuda", package_version("pycuda")),
        ("install for this driver", probe.install_hint()),
    ]


def nvrtc_version() -> str:
    """The NVRTC the cuda_c backend uses (cuda-bindings'), and every NVRTC wheel installed."""
    from gpusim.backends.cuda_c import Nvrtc, nvrtc_libraries
    try:
        used = f"{Nvrtc().identity()} (through cuda-bindings)"
    except Exception as exc:  # not installed, or its library does not load
        used = f"unavailable through cuda-bindings ({describe(exc)})"
    wheels = []
    for major, path in sorted(nvrtc_libraries().items()):
        try:
            wheels.append(Nvrtc(path).identity())
        except Exception as exc:  # a wheel whose library does not load
            wheels.append(f"{major} fails ({describe(exc)})")
    return used + (f"; wheels: {', '.join(wheels)}" if wheels else "")


def nvcc_version() -> str:
    from gpusim.backends.cuda_c import find_nvcc
    from gpusim.backends.cuda_c import nvcc_version as version
    found = find_nvcc()
    if found is None:
        return "not found"
    try:
        lines = version(found).splitlines()
        release = next((line for line in lines if "release" in line), lines[-1])
        return f"{release.strip()} ({found})"
    except Exception as exc:  # a broken toolkit
        return f"{found} fails ({describe(exc)})"


def backend_status(name: str) -> str:
    """'works' (after launching a tiny env's kernels where it runs on a GPU) or why not."""
    from gpusim.backends import get_backend
    try:
        backend = get_backend(name, quiet=True)
        if backend.device.type != "cuda":
            return "works" if name == "cpu" else "works (numba's simulator: slow, for debugging)"
        from gpusim.envs import make
        env = make("tag_continuous", 2, backend=backend, num_taggers=1, num_runners=3)
        env.reset()
        env.step(env.arrays["actions"].clone())
        backend.synchronize()
        return f"works (launched reset and step on {backend.device})"
    except Exception as exc:  # every failure is a row of the table, not a crash
        return describe(exc)


def cpu_bf16_rows() -> list:
    """What the CPU bf16 probe found (gpusim.cpu_bf16)."""
    from gpusim import cpu_bf16
    try:
        return list(cpu_bf16.doctor_rows())
    except Exception as exc:  # a probe's failure is a row too
        return [("CPU bf16", f"probe failed ({describe(exc)})")]


def rows() -> list:
    table = [("python", f"{platform.python_version()} on {platform.platform()}"),
             ("gpusim", package_version("gpusim"))]
    table += gpu_rows()
    table += [(f"backend {name}", backend_status(name)) for name in BACKENDS]
    table += cpu_bf16_rows()
    return table


def summary(table: list) -> str:
    status = dict(table)
    if not any(status[f"backend {n}"].startswith("works") for n in ("numba", "cuda_c")):
        if status["GPUs"].startswith("none"):
            return ("CPU-only machine: no CUDA GPU here; the cpu backend runs everything "
                    "(the GPU backends need an NVIDIA GPU and driver)")
        return "a GPU is here but no GPU backend works: see the rows above"
    return "a GPU backend works"


def format_table(table: list) -> str:
    width = max(len(label) for label, _ in table)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in table)


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m gpusim.doctor", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON object")
    args = parser.parse_args(argv)
    table = rows()
    if args.json:
        print(json.dumps({**dict(table), "summary": summary(table)}, indent=2))
    else:
        print(format_table(table))
        print(summary(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
