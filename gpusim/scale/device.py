"""DeviceContext: which process this is, the device it owns, and that device's memory.

One process per device. The launcher (or torchrun) says which rank a process
is through RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE; `bind` then
ties the process to `cuda:LOCAL_RANK`, or on the CPU to its share of the
cores, before anything else touches the device.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from gpusim.backends import Backend, get_backend, usable_cores
from gpusim.errors import GpusimError

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise GpusimError(f"environment variable {name} must be an integer, got '{raw}'") from None


def split_threads(cores: int, torch_threads: int = 0) -> tuple[int, int]:
    """(torch threads, numba threads) whose pools, sharing the calling thread, fill `cores`."""
    torch_count = min(torch_threads, cores) if torch_threads else cores
    return torch_count, cores - torch_count + 1


@dataclass
class DeviceContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    backend: Backend | None = None

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
        return DeviceContext(backend=self.backend)

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

        On the CPU, torch (the learner) and numba (the env kernels) each keep a
        thread pool that includes the calling thread, so together they run
        torch + numba - 1 threads. That never exceeds the process's cores:
        torch gets `torch_threads` (0: all of them), numba the rest plus the
        calling thread. Oversubscribed pools spin against each other.
        """
        self.backend = get_backend(backend_name, device_index=self.local_rank,
                                   quiet=quiet or not self.is_main)
        if self.backend.device.type == "cpu":
            if torch_threads > self.cores():
                raise GpusimError(f"trainer.torch_threads={torch_threads} exceeds the "
                                  f"{self.cores()} cores this process may use")
            torch_count, numba_count = split_threads(self.cores(), torch_threads)
            torch.set_num_threads(torch_count)
            import numba
            numba.set_num_threads(min(numba_count, numba.config.NUMBA_NUM_THREADS))
        return self.backend

    def cores(self) -> int:
        """The cores this process may use: its affinity, shared by the processes here."""
        return max(1, usable_cores() // self.local_world_size)

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
