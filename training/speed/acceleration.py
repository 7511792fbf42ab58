"""How the learner runs on its device: numeric precision and torch.compile.

`trainer.precision` (auto | fp32 | tf32 | bf16) and `trainer.compile`
(auto | on | off) are resolved once per run; `MaybeCompiled` is a function
through torch.compile that falls back to running eagerly. Whatever they pick, the
learning semantics stay those of fp32: bf16 autocast runs the matmuls in
bf16, while the weights, the optimizer state, softmax/log-softmax, the loss
reductions, GAE and returns stay in fp32.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch

from gpusim import cpu_bf16
from gpusim.cache import cache_root
from gpusim.errors import ConfigError, describe

PRECISIONS = ("auto", "fp32", "tf32", "bf16")
COMPILE_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class Precision:
    name: str  # fp32, tf32 or bf16
    device_type: str
    cache: bool = True  # autocast's cache of cast weights (off where CUDA graphs capture)

    def autocast(self):
        """The context the forward passes run in."""
        if self.name == "bf16":
            return torch.autocast(self.device_type, dtype=torch.bfloat16,
                                  cache_enabled=self.cache)
        return contextlib.nullcontext()


def resolve_precision(choice: str, device: torch.device, graphs: bool = False) -> Precision:
    """`auto`: bf16 on a CUDA GPU that supports it, else fp32 (faster on the CPUs measured:
    docs/benchmarks.md). tf32 needs a CUDA GPU. bf16 on the CPU is checked first
    (gpusim.cpu_bf16): it runs, or the run stops with one line saying why."""
    cuda = device.type == "cuda"
    bf16_ok = not cuda or torch.cuda.is_bf16_supported()
    if choice == "auto":
        choice = "bf16" if cuda and bf16_ok else "fp32"
    if choice == "tf32":
        if not cuda:
            raise ConfigError("config key 'trainer.precision' tf32 needs a CUDA GPU "
                              "(use fp32 or bf16 on the CPU)")
        # Process-wide: this process trains one run.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if choice == "bf16" and not bf16_ok:
        raise ConfigError("config key 'trainer.precision' bf16 is not supported by this GPU "
                          "(use tf32 or fp32)")
    if choice == "bf16" and not cuda:  # some CPUs die by SIGILL in oneDNN's bf16 kernels
        cpu_bf16.prepare(announce=lambda line: print(line, file=sys.stderr, flush=True))
    return Precision(choice, device.type, cache=not graphs)


def compile_enabled(choice: str, device: torch.device, pays_on_cpu: bool = False,
                    graphs: bool = False) -> bool:
    """`auto`: compile on CUDA GPUs where the steps are not replayed as CUDA graphs (which
    already take away the launches compiling would fuse, without a first compile of tens
    of seconds), and on the CPU where the learner says compiling pays for itself there
    (`pays_on_cpu`: a long run; elsewhere compiling costs more than it gains,
    docs/benchmarks.md, "compiled learner")."""
    if choice == "auto":
        return (device.type == "cuda" and not graphs) or pays_on_cpu
    return choice == "on"


def use_disk_cache():
    """Keep torch.compile's generated code in gpusim's cache folder, so that later runs load
    it instead of compiling, unless the process already chose a folder (the user, or torch
    itself at a compile before gpusim's first: it writes its default into the
    environment when it first looks)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))


class MaybeCompiled:
    """`fn` through torch.compile; if compiling or running the compiled code fails, one
    printed line, and `fn` runs eagerly from then on. It never ends the run."""

    def __init__(self, fn, what: str, enabled: bool):
        self.eager = fn
        self.what = what
        self.compiled = torch.compile(fn, dynamic=True) if enabled else None

    @property
    def active(self) -> bool:
        return self.compiled is not None

    def __call__(self, *args):
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as exc:  # any compiler failure: fall back, never crash
                self.fall_back(exc)
        return self.eager(*args)

    def fall_back(self, exc: BaseException):
        print(f"gpusim: torch.compile of {self.what} failed ({describe(exc)[:200]}); "
              "running it eagerly", file=sys.stderr, flush=True)
        self.compiled = None
