"""EventMessenger: rank 0 does a thing once, the other ranks wait for it.

Built on a torch.distributed key-value store (a `TCPStore`, or whatever
`env://` rendezvous returns under torchrun), so it works the same for local
processes and across nodes. Its main use is compiling kernels once: rank 0
compiles into the on-disk cache and publishes; the other ranks wait, then
load from the cache. A failure on rank 0 is published too, so every rank
fails with rank 0's message instead of waiting for a timeout.
"""
from __future__ import annotations

import json
from datetime import timedelta

from gpusim.errors import GpusimError


class EventError(GpusimError):
    """Rank 0 failed to do what the other ranks were waiting for."""


class EventMessenger:
    def __init__(self, store, rank: int, world_size: int, timeout_s: float = 600.0):
        if timeout_s <= 0:
            raise GpusimError(f"messenger timeout must be positive, got {timeout_s}")
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = float(timeout_s)

    def _key(self, event: str) -> str:
        return f"gpusim/event/{event}"

    def publish(self, event: str, error: str | None = None):
        """Announce that `event` happened (or failed with `error`)."""
        payload = {"rank": self.rank, "ok": error is None, "error": error}
        self.store.set(self._key(event), json.dumps(payload))

    def wait(self, event: str) -> dict:
        """Block until `event` is published; raise EventError if it failed, GpusimError on timeout."""
        key = self._key(event)
        try:
            self.store.wait([key], timedelta(seconds=self.timeout_s))
        except Exception as exc:  # the store raises a plain RuntimeError/DistStoreError on timeout
            if "timeout" in str(exc).lower() or "timed out" in str(exc).lower():
                raise GpusimError(
                    f"rank {self.rank}: timed out after {self.timeout_s:g} s waiting for rank 0 "
                    f"to finish '{event}' (raise scale.timeout_s if it is slow)") from None
            raise GpusimError(f"rank {self.rank}: lost contact with rank 0 while waiting for "
                              f"'{event}': {exc}") from None
        payload = json.loads(self.store.get(key))
        if not payload["ok"]:
            raise EventError(f"'{event}' failed on rank {payload['rank']}: {payload['error']}")
        return payload

    def once(self, event: str, fn):
        """Rank 0 runs `fn()` and publishes; others wait for it, then run `fn()` themselves.

        `fn` must be cheap the second time (e.g. it loads what rank 0 compiled
        into the on-disk cache).
        """
        if self.rank == 0:
            try:
                result = fn()
            except Exception as exc:
                self.publish(event, error=f"{type(exc).__name__}: {exc}".strip())
                raise
            self.publish(event)
            return result
        self.wait(event)
        return fn()
