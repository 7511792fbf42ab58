"""Several processes, one per device: the local launcher, rendezvous, small collectives
and a barrier over the store.

`launch(num_procs, fn, arg)` starts `fn(arg)` in `num_procs` fresh processes
(torch.multiprocessing, spawn), the same way torchrun would: each gets
RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
The launcher hosts the key-value store itself, on loopback only, on a port
the OS picks free. Under torchrun the same `init` finds the store through `env://`.

When a process fails, `launch` blames the rank that caused it, not the first
to report: a rank that died without a word (killed, crashed, `os._exit`), else
one with an error of its own, else the rank the others timed out waiting for.
It then terminates the rest and raises `RankFailed` with that rank's message.
The first Ctrl-C is left to the ranks (they stop after their iteration); a
second one terminates them.
"""
from __future__ import annotations

import io
import os
import re
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpusim.backends import set_build_once
from gpusim.errors import GpusimError, describe, exit_code
from gpusim.scale.messenger import EventMessenger

LAUNCHER_STORE = "GPUSIM_LAUNCHER_STORE"  # set by `launch`: the store lives in the launcher
POLL_S = 0.05      # how often the launcher looks at its ranks
GRACE_S = 1.0      # after a first failure, how long the other ranks' reports may take to land
TERMINATE_S = 3.0  # SIGTERM, then SIGKILL for what still runs after this
# torch's own errors when a peer is gone or late: consequences of another rank's failure
SECONDARY = re.compile(r"connection (reset|closed|refused)|broken pipe|timed out|timeout", re.I)


class RankFailed(GpusimError):
    def __init__(self, rank: int, message: str, exit_code: int = 1):
        super().__init__(f"rank {rank}: {message}")
        self.rank = rank
        self.exit_code = exit_code


class Report(NamedTuple):
    """What a failing rank tells the launcher before it exits."""
    rank: int
    message: str
    exit_code: int
    secondary: bool  # a communication error: another rank is likely the cause


# ---- the local launcher -------------------------------------------------------------
def launch(num_procs: int, fn, arg, timeout_s: float = 600.0,
           collective_timeout_s: float | None = None) -> None:
    """Run `fn(arg)` in `num_procs` local processes; return when all succeed.

    Raises RankFailed naming the rank that caused a failure (see the module
    docstring); the other processes are terminated, so a failure never hangs.
    `collective_timeout_s` (the ranks' `init` value) only words that message.
    """
    store = loopback_store(num_procs, timeout_s)
    reports = mp.get_context("spawn").SimpleQueue()
    ctrl_c = CtrlCCounter()
    processes = []
    try:
        processes = mp.start_processes(_child, args=(fn, arg, num_procs, store.port, reports),
                                       nprocs=num_procs, join=False,
                                       start_method="spawn").processes
        failure = _watch(processes, reports, ctrl_c, collective_timeout_s)
    finally:
        _stop(processes)
        ctrl_c.restore()
        del store
    if failure is not None:
        raise failure


def loopback_store(num_procs: int, timeout_s: float):
    """The launcher's TCPStore, reachable from this host only (127.0.0.1, a free port).

    TCPStore binds every interface when it opens the port itself, so we open it.
    The store takes the socket's descriptor over and closes it when it goes.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        store = dist.TCPStore("127.0.0.1", sock.getsockname()[1], num_procs, is_master=True,
                              timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
                              master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now: closing it here too could close another
    return store


class CtrlCCounter:
    """Counts Ctrl-Cs (SIGINT) instead of raising, so the watch loop decides what each means."""

    def __init__(self):
        self.count = 0
        try:
            self.previous = signal.signal(signal.SIGINT, self._pressed)
        except ValueError:  # not the main thread, where Ctrl-C never arrives anyway
            self.previous = None

    def _pressed(self, signum, frame):
        self.count += 1

    def restore(self):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _watch(processes, reports, ctrl_c, collective_timeout_s) -> RankFailed | None:
    """Wait for every rank; on a failure, wait for its cause (up to GRACE_S) and name it."""
    heard: dict[int, Report] = {}
    first_failure = None
    handled_presses = 0
    while True:
        codes = [p.exitcode for p in processes]  # before draining: an exited rank's report
        while not reports.empty():               # is already in the queue
            report = reports.get()
            heard.setdefault(report.rank, report)
        if all(code == 0 for code in codes):
            return None
        if heard or any(code for code in codes):
            first_failure = first_failure or time.monotonic()
            cause = _cause(codes, heard)
            if cause is not None:
                return cause
            if None not in codes or time.monotonic() - first_failure >= GRACE_S:
                return _cause_by_silence(codes, heard, collective_timeout_s)
        if ctrl_c.count > handled_presses:
            handled_presses = ctrl_c.count
            if handled_presses > 1:
                raise KeyboardInterrupt
            print("stopping after the current iteration (Ctrl-C again to stop now)",
                  file=sys.stderr, flush=True)
        time.sleep(POLL_S)


def _cause(codes, heard) -> RankFailed | None:
    """A rank whose failure is its own: it died without a report, or reported its own error."""
    for rank, code in enumerate(codes):
        if code and rank not in heard:  # killed, crashed or os._exit: it had no say
            if code < 0:
                return RankFailed(rank, f"killed by signal {_signal_name(-code)}")
            return RankFailed(rank, f"exited with code {code}", code)
    for report in heard.values():  # in the order they arrived
        if not report.secondary:
            return RankFailed(report.rank, report.message, report.exit_code)
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal, which has no name
        return str(number)


def _cause_by_silence(codes, heard, collective_timeout_s) -> RankFailed:
    """Every failed rank lost a peer or timed out: blame a rank that is silent, else report."""
    within = f"={collective_timeout_s:g} s" if collective_timeout_s else ""
    for rank, code in enumerate(codes):
        if code is None and rank not in heard:
            return RankFailed(rank, f"did not reach a collective within "
                                    f"scale.collective_timeout_s{within} (the other ranks "
                                    "timed out waiting for it)")
    for rank, code in enumerate(codes):
        if code == 0:  # it finished while the others still waited for it
            return RankFailed(rank, "exited cleanly while the other ranks still waited for "
                                    "it in a collective")
    first = heard[min(heard)]
    return RankFailed(first.rank, first.message, first.exit_code)


def _stop(processes):
    """SIGTERM every rank still running, then SIGKILL what is left after TERMINATE_S."""
    running = [p for p in processes if p.is_alive()]
    for process in running:
        process.terminate()
    deadline = time.monotonic() + TERMINATE_S
    for process in running:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in running:
        if process.is_alive():
            process.kill()
            process.join(1.0)


def _child(index, fn, arg, world_size, port, reports):
    os.environ.update({"RANK": str(index), "LOCAL_RANK": str(index),
                       "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       LAUNCHER_STORE: "1"})
    try:
        code = fn(arg)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        if os.environ.get("GPUSIM_DEBUG"):
            traceback.print_exc()
        message = describe(exc)
        # Our own errors say whom they waited for; torch's say only that a peer is gone.
        secondary = not isinstance(exc, GpusimError) and bool(SECONDARY.search(message))
        code = exit_code(exc)  # bad input is 2 in every rank, as in a lone process
        reports.put(Report(index, message, code, secondary))
        exit_now(code)
    if code:
        reports.put(Report(index, f"exited with code {code}", code, False))
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
_store = None  # the run's store, set by `init`: `wait_for_all` meets there
_barriers_passed: dict[str, int] = {}  # per name, so that a name can be used again


def init(context, timeout_s: float = 600.0, collective_timeout_s: float = 300.0):
    """Join the process group of a multi-process run and install the EventMessenger.

    Does nothing for a lone process. NCCL on CUDA devices, gloo on the CPU.
    `timeout_s` bounds the rendezvous and the waits for rank 0's compiles;
    `collective_timeout_s` each collective (a rank that never arrives ends the run).
    """
    global _store
    if context.world_size == 1:
        return
    timeout = timedelta(seconds=timeout_s)
    addr = os.environ.get("MASTER_ADDR")
    port = os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise GpusimError("WORLD_SIZE > 1 needs MASTER_ADDR and MASTER_PORT "
                          "(start with --num_gpus N, or with torchrun)")
    if not port.strip().isdigit() or not 0 < int(port) < 65536:
        raise GpusimError(f"environment variable MASTER_PORT must be a port number "
                          f"1..65535, got {port!r}")
    if os.environ.get(LAUNCHER_STORE):
        store = dist.TCPStore(addr, int(port), context.world_size, is_master=False,
                              timeout=timeout)
    else:  # torchrun: its env:// rendezvous knows where the store is
        store, _, _ = next(dist.rendezvous("env://", context.rank, context.world_size,
                                           timeout=timeout))
    backend = "nccl" if context.device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore("group", store),
                            rank=context.rank, world_size=context.world_size,
                            timeout=timedelta(seconds=collective_timeout_s))
    # Kernels compile once per run: rank 0 compiles, the others wait, then load its cache.
    messenger = EventMessenger(dist.PrefixStore("messenger", store), context.rank,
                               context.world_size, timeout_s)
    set_build_once(messenger.once)
    _store = dist.PrefixStore("barrier", store)


def shutdown():
    global _store
    set_build_once(None)
    _store = None
    _barriers_passed.clear()
    if active():
        dist.destroy_process_group()


def wait_for_all(name: str, timeout_s: float):
    """Return once every rank has called `wait_for_all(name, ...)`; a no-op for a lone process.

    A barrier over the store, not the process group: ranks whose work takes
    different times (auto-scale searches) meet here, with their own timeout,
    before a collective such as `min_across` that would time out sooner.
    """
    if _store is None:
        return
    calls = _barriers_passed.get(name, 0)
    _barriers_passed[name] = calls + 1
    key = f"{name}/{calls}"
    if _store.add(f"{key}/arrived", 1) == world_size():
        _store.set(f"{key}/all", "1")  # the last to arrive lets everyone go
    try:
        _store.wait([f"{key}/all"], timedelta(seconds=timeout_s))
    except Exception as exc:  # noqa: BLE001 - the store raises plain errors on timeout
        if "timeout" not in str(exc).lower() and "timed out" not in str(exc).lower():
            raise GpusimError(f"lost contact with the store while waiting at '{name}': "
                              f"{describe(exc)}") from None
        arrived = _store.add(f"{key}/arrived", 0)
        raise GpusimError(f"timed out after {timeout_s:g} s waiting at '{name}': "
                          f"{arrived} of {world_size()} ranks arrived (the others are stuck "
                          "or slower than that)") from None


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
