"""Several processes, one per device: the local launcher, rendezvous, and small collectives.

`launch(num_procs, fn, arg)` starts `fn(arg)` in `num_procs` fresh processes
(torch.multiprocessing, spawn), the same way torchrun would: each gets
RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
The launcher hosts the key-value store itself on a port the OS picks free.
Under torchrun the same `init` finds the store through `env://`.

When any process fails, the others are terminated at once and `launch`
raises with the failing rank's own message.
"""
from __future__ import annotations

import io
import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpusim.backends import set_build_once
from gpusim.errors import GpusimError, describe
from gpusim.scale.messenger import EventMessenger

LAUNCHER_STORE = "GPUSIM_LAUNCHER_STORE"  # set by `launch`: the store lives in the launcher


class RankFailed(GpusimError):
    def __init__(self, rank: int, message: str, exit_code: int = 1):
        super().__init__(f"rank {rank}: {message}")
        self.rank = rank
        self.exit_code = exit_code


# ---- the local launcher -------------------------------------------------------------
def launch(num_procs: int, fn, arg, timeout_s: float = 600.0) -> None:
    """Run `fn(arg)` in `num_procs` local processes; return when all succeed.

    Raises RankFailed with the first failing rank's message; the other
    processes are terminated (not waited for), so a failure never hangs.
    """
    store = dist.TCPStore("127.0.0.1", 0, num_procs, is_master=True,
                          timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    errors = mp.get_context("spawn").SimpleQueue()
    context = mp.start_processes(_child, args=(fn, arg, num_procs, store.port, errors),
                                 nprocs=num_procs, join=False, start_method="spawn")
    try:
        while not context.join(timeout=0.5):
            pass
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        first = errors.get() if not errors.empty() else None
        if first is not None:
            raise RankFailed(first[0], first[1], first[2]) from None
        raise RankFailed(exc.error_index, f"exited unexpectedly ({exc})") from None
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
        del store


def _child(index, fn, arg, world_size, port, errors):
    os.environ.update({"RANK": str(index), "LOCAL_RANK": str(index),
                       "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       LAUNCHER_STORE: "1"})
    try:
        code = fn(arg)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        if os.environ.get("GPUSIM_DEBUG"):
            traceback.print_exc()
        errors.put((index, describe(exc), 130 if isinstance(exc, KeyboardInterrupt) else 1))
        exit_now(1)
    if code:
        errors.put((index, f"exited with code {code}", code))
    exit_now(code or 0)


def exit_now(code: int):
    """End this rank's process at once, its output flushed, skipping the interpreter's teardown.

    There, a gloo worker thread still releasing a tensor of the last collective
    needs the GIL the exiting interpreter holds, and the process aborts ("terminate
    called without an active exception") after a clean run. Files are closed (and
    checkpoints fsynced) before this.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ---- joining the group --------------------------------------------------------------
def init(context, timeout_s: float = 600.0):
    """Join the process group of a multi-process run and install the EventMessenger.

    Does nothing for a lone process. NCCL on CUDA devices, gloo on the CPU.
    """
    if context.world_size == 1:
        return
    timeout = timedelta(seconds=timeout_s)
    addr = os.environ.get("MASTER_ADDR")
    port = os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise GpusimError("WORLD_SIZE > 1 needs MASTER_ADDR and MASTER_PORT "
                          "(start with --num_gpus N, or with torchrun)")
    if os.environ.get(LAUNCHER_STORE):
        store = dist.TCPStore(addr, int(port), context.world_size, is_master=False,
                              timeout=timeout)
    else:  # torchrun: its env:// rendezvous knows where the store is
        store, _, _ = next(dist.rendezvous("env://", context.rank, context.world_size,
                                           timeout=timeout))
    backend = "nccl" if context.device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore("group", store),
                            rank=context.rank, world_size=context.world_size, timeout=timeout)
    # Kernels compile once per run: rank 0 compiles, the others wait, then load its cache.
    messenger = EventMessenger(dist.PrefixStore("messenger", store), context.rank,
                               context.world_size, timeout_s)
    set_build_once(messenger.once)


def shutdown():
    set_build_once(None)
    if active():
        dist.destroy_process_group()


# ---- collectives (no-ops for a lone process) ------------------------------------------
def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def _tensor_device():
    if active() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def min_across(value: int) -> int:
    """The smallest `value` over all ranks."""
    if not active():
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=_tensor_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def all_gather(obj) -> list:
    """Every rank's `obj`, in rank order (picklable objects; meant for small data)."""
    if not active():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_to_main(obj) -> list | None:
    """Every rank's `obj` on rank 0, in rank order; None on the other ranks."""
    if not active():
        return [obj]
    # Tensors travel as torch.save bytes: object collectives do not pickle them reliably.
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(buffer.getvalue(), out, dst=0)
    if out is None:
        return None
    return [torch.load(io.BytesIO(data), weights_only=True) for data in out]


def launched_here() -> bool:
    """Whether this process was started by `launch` (which reports its errors) or not."""
    return bool(os.environ.get(LAUNCHER_STORE))
