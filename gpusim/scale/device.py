"""DeviceContext: which process this is, the device it owns, and that device's memory.

One process per device. The launcher (or torchrun) says which rank a process
is through RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE; `bind` then
ties the process to `cuda:LOCAL_RANK`, or on the CPU to its share of the
cores, before anything else touches the device.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace

import torch

from gpusim import cpu_threads
from gpusim.backends import Backend, get_backend
from gpusim.errors import GpusimError
from gpusim.scale import threads

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise GpusimError(f"environment variable {name} must be an integer, got '{raw}'") from None


_warned_spinning = False


def _warn_spinning():
    global _warned_spinning
    _warned_spinning = True
    print("gpusim: torch was imported before gpusim, so its OpenMP threads spin between "
          "parallel regions (taking cores other processes need); import gpusim first or "
          "set OMP_WAIT_POLICY=PASSIVE", file=sys.stderr)


@dataclass
class DeviceContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    backend: Backend | None = None
    torch_threads: int = 0              # trainer.torch_threads (0: decided by the work)
    cpu_cores: int = 0                  # the cores this process may use (0: look them up)
    thread_plan: threads.ThreadPlan | None = None  # on a CPU, once bound: the counts in use

    @classmethod
    def from_environment(cls) -> "DeviceContext":
        """The rank variables set by gpusim's launcher or torchrun (a lone process by default)."""
        world = _env_int("WORLD_SIZE", 1)
        context = cls(rank=_env_int("RANK", 0), local_rank=_env_int("LOCAL_RANK", 0),
                      world_size=world, local_world_size=_env_int("LOCAL_WORLD_SIZE", world))
        if not (0 <= context.rank < world and 0 <= context.local_rank < context.local_world_size
                <= world):
            raise GpusimError(f"inconsistent rank variables: RANK={context.rank} "
                              f"LOCAL_RANK={context.local_rank} WORLD_SIZE={world} "
                              f"LOCAL_WORLD_SIZE={context.local_world_size}")
        return context

    def replica_offset(self, num_envs: int) -> int:
        """The global id of this rank's first replica: rank r steps replicas r*num_envs...,
        so no two replicas of a run draw from the same RNG stream."""
        return self.rank * num_envs

    def alone(self) -> "DeviceContext":
        """This process's device as a lone process (for auto-scale trials: no DDP, offset 0)."""
        return replace(self, rank=0, local_rank=0, world_size=1, local_world_size=1,
                       cpu_cores=self.cores())

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        if self.backend is None:
            raise GpusimError("DeviceContext.bind() has not been called")
        return self.backend.device

    def bind(self, backend_name: str = "auto", quiet: bool = False,
             torch_threads: int = 0) -> Backend:
        """Bind this process to its device: `cuda:local_rank`, or its share of the CPU cores.

        On the CPU every thread pool starts with one thread (or what the user set:
        `torch_threads`, OMP_NUM_THREADS, NUMBA_NUM_THREADS; gpusim.scale.threads)
        until `fit_threads` knows the run's work.
        """
        self.backend = get_backend(backend_name, device_index=self.local_rank,
                                   quiet=quiet or not self.is_main)
        if self.backend.device.type == "cpu":
            if torch_threads > self.cores():
                raise GpusimError(f"trainer.torch_threads={torch_threads} exceeds the "
                                  f"{self.cores()} cores this process may use")
            self.torch_threads = torch_threads
            self.fit_threads(None)
        return self.backend

    def fit_threads(self, work: threads.Work | None):
        """Choose the CPU thread counts for `work` (gpusim.scale.threads) and start the
        rollout's; nothing on a GPU device."""
        if self.backend is None or self.backend.device.type != "cpu":
            return
        self.thread_plan = threads.plan(self.cores(), work, self.torch_threads)
        self.use_threads("rollout")
        plan = self.thread_plan
        if max(plan.rollout_torch, plan.update_torch) > 1 and cpu_threads.torch_loaded_first \
                and self.is_main and not _warned_spinning:
            _warn_spinning()

    def use_threads(self, phase: str):
        """Set the thread counts of `phase` ("rollout" or "update") in this thread."""
        plan = self.thread_plan
        if plan is None:
            return
        count = plan.rollout_torch if phase == "rollout" else plan.update_torch
        if torch.get_num_threads() != count:
            torch.set_num_threads(count)
        import numba
        numba.set_num_threads(min(plan.numba, numba.config.NUMBA_NUM_THREADS))

    def cores(self) -> int:
        """The cores this process may use: its affinity and cgroup quota, shared by the
        processes of this machine."""
        if self.cpu_cores:
            return self.cpu_cores
        return max(1, cpu_threads.usable_cores() // self.local_world_size)

    # ---- memory --------------------------------------------------------------
    def memory(self) -> tuple[int, int]:
        """(free, total) bytes of this process's device: GPU memory, or RAM on the CPU."""
        if self.backend is None:
            raise GpusimError("DeviceContext.bind() has not been called")
        return self.backend.memory()

    def default_budget(self, cpu_fraction: float) -> int:
        """Bytes a run may fill by default: free GPU memory, or a share of free RAM on the CPU.

        Processes sharing a machine's RAM split the CPU budget between them.
        """
        free, _ = self.memory()
        if self.device.type == "cuda":
            return free
        return int(free * cpu_fraction / self.local_world_size)
