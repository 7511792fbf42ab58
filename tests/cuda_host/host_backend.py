"""Run gpusim's CUDA C kernels on the CPU, for tests: the host shim as a backend.

`HostCBackend` is a `gpusim` backend on CPU tensors whose kernels are the
launchers of `gpusim.check.host_shim.build_library` (the kernel file compiled
with g++ against the host shim), so an env runs its CUDA C kernels exactly
where the `cuda_c` backend would run them on a GPU: same spec ->
"file.cu:function" lookup, same generated header, argument convention and
checks (gpusim.backends.cuda_c). The shim's builders and ThreadSanitizer's
race check live in gpusim.check.host_shim, re-exported here.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gpusim.backends.base import Kernel, ThreadBlockBackend
from gpusim.backends.cuda_c import (GENERATED_HEADER, TensorPointer, include_dirs,
                                    launch_signature, locate)
from gpusim.cache import key_hash
from gpusim.check.host_shim import (GXX_FLAGS, SHIM_DIR, build_library, call,  # noqa: F401
                                    compiler_problem, find_gxx, race_check, tsan_problem)


class HostCBackend(ThreadBlockBackend):
    """CPU tensors; each spec runs its CUDA C kernel through the host shim."""
    name = "cuda_c_host"
    device = torch.device("cpu")

    def __init__(self, build_dir):
        self.build_dir = Path(build_dir)
        self._libraries = {}  # (source, generated header) -> library

    def view(self, tensor):
        return TensorPointer(tensor)

    def _compile(self, spec):
        return _HostLaunch(self, *locate(spec), spec.name)

    def library(self, source: Path, header: str, params: list):
        """The host library of `source` built with generated header `header` (once)."""
        key = (source, header)
        if key not in self._libraries:
            build = self.build_dir / key_hash(str(source), header)
            build.mkdir(parents=True, exist_ok=True)
            (build / GENERATED_HEADER).write_text(header)
            self._libraries[key] = build_library(source.read_text(), source.name, build,
                                                 include_dirs(source, build), params)
        return self._libraries[key]


class _HostLaunch(Kernel):
    """A host-shim kernel, built and its C signature checked per argument layout."""

    def __init__(self, backend, source, function, what):
        self.backend, self.source, self.function, self.what = backend, source, function, what
        self.libraries = {}  # (type(s), type(p)) -> library

    def precompile(self, s, p):
        header, params, _ = launch_signature(self.source, self.function, s, p, self.what)
        self.libraries[(type(s), type(p))] = self.backend.library(self.source, header, params)

    def __call__(self, num_envs, num_agents, s, p):
        if (type(s), type(p)) not in self.libraries:
            self.precompile(s, p)
        call(self.libraries[(type(s), type(p))], self.function, num_envs, num_agents, *s, *p)
