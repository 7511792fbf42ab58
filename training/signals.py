"""Stopping a run between iterations: the first SIGINT or SIGTERM asks the loop to stop
after the current iteration, with a checkpoint (`stop_requests`); the loop then raises
`Stopped`. The second signal stops at once."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading


class Stopped(Exception):
    """SIGINT or SIGTERM: the run stopped after an iteration, with a checkpoint of it."""

    def __init__(self, iteration: int):
        super().__init__(f"interrupted after iteration {iteration}")
        self.iteration = iteration


@contextlib.contextmanager
def stop_requests(announce: bool = True):
    """A flag that the first SIGINT or SIGTERM sets; the second stops at once.

    The loop checks it after each iteration, so Ctrl-C leaves a checkpoint of
    a whole iteration behind (only from the main thread: elsewhere signals
    keep their handlers).
    """
    flag = {"requested": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def handle(signum, frame):
        if flag["requested"]:
            raise KeyboardInterrupt
        flag["requested"] = True
        if announce:
            print("\nstopping after this iteration, with a checkpoint "
                  "(Ctrl-C again to stop now)", file=sys.stderr, flush=True)
    for sig in signals:
        signal.signal(sig, handle)
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
