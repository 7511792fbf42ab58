"""Auto-scaling searches: the fastest size, or the largest that fits the device.

The generic layer of auto-scaling: it knows no training. Its trials are callables
(training.autoscale.auto_scale gives it short training runs and env builds).

- `fastest` (the throughput objective) starts at the config's value and
  steps geometrically (x4) while each step fits the memory measured so far
  and gains at least `saturation` per doubling, then refines the last
  bracket at its geometric midpoint: a handful of trials from 16 to 16,384;
- `largest_passing` (the memory objective) brackets by doubling, then
  bisects, returning the largest value that passes, given that trials pass
  below some size and fail above it.
`Searcher` runs real trials: it measures each one's peak memory, counts
out-of-memory and launch-resource errors (and exceeding the memory limit) as
failures, cleans up after each, and lets any other error abort the search
with its message.
"""
from __future__ import annotations

import ctypes
import gc
import math
import re
import time
from dataclasses import asdict, dataclass, field

import torch

from gpusim.errors import GpusimError, describe
from gpusim.sizes import format_size


@dataclass
class Trial:
    value: int
    ok: bool
    seconds: float
    peak_bytes: int | None = None
    note: str = ""
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["seconds"] = round(self.seconds, 3)
        return out


class _Clock:
    """No new trial starts once `limit_s` has passed (the first one always runs)."""

    def __init__(self, limit_s: float | None):
        self.start = time.perf_counter()
        self.limit_s = limit_s

    def out_of_time(self) -> bool:
        return self.limit_s is not None and time.perf_counter() - self.start > self.limit_s


def largest_passing(trial, cap: int, time_limit_s: float | None = None):
    """(largest value in [1, cap] with trial(value) true, or 0 if 1 fails; values tried).

    `trial(value) -> bool`. Brackets by doubling, then bisects. Once
    `time_limit_s` has passed no new trial starts and the largest pass so far
    is returned. Exceptions from `trial` propagate.
    """
    if cap < 1:
        raise GpusimError(f"search cap must be at least 1, got {cap}")
    clock = _Clock(time_limit_s)
    tried = []

    def passes(value):
        tried.append(value)
        return trial(value)

    if not passes(1):
        return 0, tried
    good, bad = 1, None
    while bad is None and good < cap and not clock.out_of_time():
        value = min(2 * good, cap)
        if passes(value):
            good = value
        else:
            bad = value
    while bad is not None and bad - good > 1 and not clock.out_of_time():
        value = (good + bad) // 2
        if passes(value):
            good = value
        else:
            bad = value
    return good, tried


@dataclass
class Outcome:
    """What a throughput search found: its pick (0 if `start` did not fit), each value's
    throughput (None: did not fit), and why it stopped, in words."""
    pick: int
    rates: dict
    why: str


def fastest(throughput, cap: int, saturation: float, start: int = 1,
            time_limit_s: float | None = None, growth: int = 4,
            bound=None, resolution: float = 1.0) -> Outcome:
    """Where throughput stops paying, from `start` upwards.

    `throughput(value) -> float`, or None where the value does not fit. From
    `start`, step by `growth` while the next value fits and is faster by at
    least `saturation` per doubling (prorated: `saturation * log2(step)`), never
    past `bound()` (the largest value the memory measured so far allows; None:
    no bound) nor `cap`. Then refine the last bracket [lo, hi] at its geometric
    midpoint while it is wider than a factor `1 + resolution`, unless `hi` gained
    less over `lo` than one doubling should (its midpoint is not worth a trial).
    Larger values that gain less are not worth their memory and their larger
    (staler) batches.
    """
    if not 1 <= start <= cap:
        raise GpusimError(f"search start must lie in 1..{cap}, got {start}")
    if growth < 2:
        raise GpusimError(f"search growth must be at least 2, got {growth}")
    clock = _Clock(time_limit_s)
    rates = {start: throughput(start)}
    if rates[start] is None:
        return Outcome(0, rates, f"the start, {start}, did not fit")

    def gain(value, over) -> float:
        return rates[value] / rates[over] - 1 if rates[value] is not None else -math.inf

    def pays(value, over) -> bool:
        rates[value] = throughput(value)
        return gain(value, over) >= saturation * math.log2(value / over)

    lo, hi, why = start, None, None
    while hi is None:
        top = min(cap, bound() if bound is not None else cap)
        if clock.out_of_time():
            why = f"its time limit ({time_limit_s:g} s) passed"
            break
        if lo >= top:
            why = f"{lo} is the largest value the search may try (scale.max_num_envs)" \
                if top == cap else f"{lo} is the largest value the measured memory allows"
            break
        value = min(lo * growth, top)
        if pays(value, lo):
            lo = value
        else:
            hi = value
            why = _stop_reason(value, lo, rates, saturation)
    if hi is not None and rates[hi] is not None and gain(hi, lo) < saturation:
        hi = None  # the whole step gained less than one doubling should: its midpoint too
    while hi is not None and hi > lo * (1 + resolution) and not clock.out_of_time():
        value = max(lo + 1, min(hi - 1, round(math.sqrt(lo * hi))))
        if pays(value, lo):
            lo = value
        else:
            hi = value
    return Outcome(lo, rates, why)


def _stop_reason(value: int, lo: int, rates: dict, saturation: float) -> str:
    if rates[value] is None:
        return f"{value} did not fit"
    step = math.log2(value / lo)
    return (f"{value} gained {rates[value] / rates[lo] - 1:+.0%} over {lo}, less than "
            f"{saturation * step:.0%} ({saturation:.0%} per doubling)")


# ---- measuring trials -------------------------------------------------------------
def _trim_heap():
    """Hand freed heap pages back to the OS (glibc), so RSS reflects live memory."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _status_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field_name}:\s+(\d+) kB", f.read(), re.MULTILINE).group(1))


class MemoryProbe:
    """Peak memory a block of work adds on a device: torch's allocator on CUDA, RSS on the CPU.

    On the CPU the kernel's high-water mark of the resident set is reset
    before each trial (Linux: /proc/self/clear_refs), so a transient peak
    inside the trial (e.g. during the backward pass) is caught too.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.base = 0
        if device.type == "cpu":
            try:
                self._reset_cpu_peak()
                _status_kib("VmHWM")
            except (OSError, AttributeError):
                raise GpusimError("measuring memory on the CPU needs Linux's /proc "
                                  "(clear_refs and VmHWM); auto-scaling is not available "
                                  "here on the cpu backend") from None

    @staticmethod
    def _reset_cpu_peak():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def start(self):
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            _trim_heap()
            self._reset_cpu_peak()
            self.base = _status_kib("VmRSS") * 1024

    def peak(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self.base
        return _status_kib("VmHWM") * 1024 - self.base


class Searcher:
    """One search: runs `body(value)` as measured trials against a memory limit in bytes.

    `body(value)` returns a dict of what it measured (with `env_steps_per_s`
    for the throughput objective); it is kept in the trial's `info`.
    """

    def __init__(self, name: str, body, backend, limit_bytes: int, cap: int,
                 time_limit_s: float | None = None, log=print):
        self.name = name
        self.body = body
        self.backend = backend
        self.limit = int(limit_bytes)
        self.cap = cap
        self.time_limit_s = time_limit_s
        self.log = log
        self.trials: list[Trial] = []
        self.probe = MemoryProbe(backend.device)

    def run(self) -> int:
        """The largest value that fits (the memory objective)."""
        self.body(1)  # warm-up, not measured: compiles kernels and starts thread pools
        gc.collect()
        self.backend.free_memory()
        best, _ = largest_passing(lambda value: self.measure(value).ok, self.cap,
                                  self.time_limit_s)
        return best

    def run_fastest(self, saturation: float, start: int = 1, growth: int = 4,
                    resolution: float = 1.0) -> Outcome:
        """Where throughput saturates (the throughput objective), within the memory the
        trials so far were measured to take; pick 0 if `start` does not fit."""
        return fastest(self._throughput, self.cap, saturation, start, self.time_limit_s,
                       growth, self.largest_fitting, resolution)

    def run_quickest(self, predicted_s, start: int, sizes, slack: float) -> Quickest:
        """The value of least predicted time to a score among `sizes` (the time_to_score
        objective), within the memory the trials so far were measured to take."""
        def again(value):
            trial = self.measure(value)
            return trial.info.get("env_steps_per_s") if trial.ok else None
        return quickest(self._throughput, predicted_s, start,
                        [v for v in sizes if v <= self.cap], slack, self.time_limit_s,
                        self.largest_fitting, again)

    def _throughput(self, value: int) -> float | None:
        trial = self.trial(value) or self.measure(value)  # a trial given in advance counts
        return trial.info.get("env_steps_per_s") if trial.ok else None

    def largest_fitting(self) -> int:
        """The largest value whose peak memory, extrapolated from the passing trials, stays
        within the limit: linear through the two largest (through zero from one), so a
        first trial's fixed costs make the bound cautious until a second one is measured."""
        passed = self._peaks()
        if not passed:
            return self.cap
        v1, p1 = passed[-1]
        v0, p0 = passed[-2] if len(passed) > 1 else (0, 0)
        per_value = max((p1 - p0) / (v1 - v0), 1.0)
        return max(v1, min(self.cap, int(v1 + (self.limit - p1) / per_value)))

    def trial(self, value: int) -> Trial | None:
        """The trial of `value`, if it ran."""
        return next((t for t in self.trials if t.value == value), None)

    def _peaks(self) -> list:
        """(value, peak bytes) of each passing value, increasing (a value measured twice:
        its larger peak)."""
        peaks = {}
        for t in self.trials:
            if t.ok and t.peak_bytes is not None:
                peaks[t.value] = max(t.peak_bytes, peaks.get(t.value, 0))
        return sorted(peaks.items())

    def _predicted(self, value: int) -> int | None:
        """Peak bytes at `value`, extrapolated from the two largest passing trials."""
        passed = self._peaks()
        if len(passed) < 2 or passed[-1][0] >= value:
            return None
        (v0, p0), (v1, p1) = passed[-2:]
        slope = max(0.0, (p1 - p0) / (v1 - v0))
        return int(p1 + slope * (value - v1))

    def measure(self, value: int) -> Trial:
        """Run (and record, and log) the trial of `value`."""
        start = time.perf_counter()
        predicted = self._predicted(value)
        if predicted is not None and predicted > 1.5 * self.limit:
            # Far past the limit: do not risk the machine's memory to confirm it.
            trial = Trial(value, False, 0.0, predicted,
                          f"not run: predicted {format_size(predicted)}")
        else:
            trial = self._run_body(value, start)
        self.trials.append(trial)
        verdict = "pass" if trial.ok else "fail"
        rate = trial.info.get("env_steps_per_s")
        rate = f"{rate:>12,.0f} env steps/s" if rate is not None else ""
        self.log(f"  {self.name}={value:<7d} {verdict}  {trial.seconds:6.2f} s  "
                 f"peak {format_size(trial.peak_bytes):>10}  {rate}  {trial.note}".rstrip())
        return trial

    def _run_body(self, value: int, start: float) -> Trial:
        self.probe.start()
        try:
            info = self.body(value) or {}
            peak = self.probe.peak()
        except Exception as exc:  # classified just below
            if not self.backend.is_resource_error(exc):
                raise
            return Trial(value, False, time.perf_counter() - start, None, describe(exc)[:200])
        finally:
            gc.collect()
            self.backend.free_memory()
        ok = peak <= self.limit
        note = "" if ok else f"over the limit of {format_size(self.limit)}"
        return Trial(value, ok, time.perf_counter() - start, peak, note, info)


# ---- the time_to_score objective ----------------------------------------------------
@dataclass
class Quickest:
    """What a time-to-score search found: its pick, each value's measured throughput and
    predicted time (None: did not fit), and why it picked it, in words."""
    pick: int
    rates: dict
    times: dict
    why: str


def doublings(start: int, cap: int, lowest: int = 1, growth: int = 2) -> list:
    """The values `start` x and / `growth`^i within `lowest`..`cap`, in increasing order."""
    values, value = [], start
    while value // growth >= lowest:
        value //= growth
        values.append(value)
    values, value = values[::-1] + [start], start
    while value * growth <= cap:
        value *= growth
        values.append(value)
    return values


def quickest(throughput, predicted_s, start: int, sizes, slack: float = 0.1,
             time_limit_s: float | None = None, bound=None, again=None) -> Quickest:
    """The value with the least predicted time to a score, steadily.

    `throughput(value) -> float | None` measures; `predicted_s(value, rate)` turns a
    throughput into the predicted time; `sizes` are the values worth trying, `start`
    among them. From `start` it steps down `sizes` while the time falls, then up (within
    `bound()`) while the time stays within `1 + slack` of the least so far: the time is
    U-shaped in the value (throughput saturates; the env steps a score needs grow with
    the batch). A step up is not measured where even an optimistic throughput could not
    beat the least time by `slack`: the throughput's growth over the last step up,
    continued (throughput saturates, so its gain per doubling only shrinks).
    The pick is, of the values within `1 + slack` of the least time, the one nearest
    `start` (on a log scale; the smaller on a tie): values whose predictions differ
    by less than a trial's noise are not worth leaving the config for, and the same
    machine then picks the same value run after run. `again(value)`, where given,
    measures a value once more: `start` (at once: the first trial of a process runs
    cold) and the quickest are measured twice, keeping the faster (another process on
    the machine only ever slows a trial down).
    """
    sizes = sorted(set(sizes))
    if start not in sizes:
        raise GpusimError(f"search start {start} is not among the sizes to try {sizes}")
    clock = _Clock(time_limit_s)
    rates, times = {}, {}
    why_up = None

    def time_of(value):
        rates[value] = throughput(value)
        times[value] = None if rates[value] is None else predicted_s(value, rates[value])
        return times[value]

    def least():
        return min(t for t in times.values() if t is not None)

    def remeasure(value):
        rate = again(value)
        if rate is not None and rates[value] is not None and rate > rates[value]:
            rates[value], times[value] = rate, predicted_s(value, rate)

    if time_of(start) is None:
        return Quickest(0, rates, times, f"the start, {start}, did not fit")
    if again is not None:  # the first trial of a process runs cold: the start once more,
        remeasure(start)   # before the steps from it are judged against it
    here = sizes.index(start)
    for below in reversed(sizes[:here]):
        if clock.out_of_time():
            break
        time_below = time_of(below)
        if time_below is None or time_below >= least():
            break
    climbed = [start]
    for above in sizes[here + 1:]:
        if clock.out_of_time() or above > (bound() if bound is not None else above):
            break
        if len(climbed) > 1:
            v0, v1 = climbed[-2:]
            gain = max(1.0, rates[v1] / rates[v0]) ** (math.log(above / v1) / math.log(v1 / v0))
            best_case = predicted_s(above, rates[v1] * gain)
            if best_case is None or best_case * (1 + slack) >= least():
                why_up = (f"{above} could not beat {least():,.1f} s by {slack:.0%} even at "
                          f"{gain:.2f}x the throughput of {v1}")
                break
        time_above = time_of(above)
        if time_above is None or time_above > (1 + slack) * least():
            break
        climbed.append(above)
    quickest_value = min((v for v, t in times.items() if t is not None), key=times.get)
    if again is not None and quickest_value != start and not clock.out_of_time():
        remeasure(quickest_value)
    best = least()
    near = [v for v, t in times.items() if t is not None and t <= (1 + slack) * best]
    pick = min(near, key=lambda v: (abs(math.log(v / start)), v))
    fastest_value = min(near, key=lambda v: times[v])
    if pick != fastest_value:
        why = (f"{fastest_value} predicts the least time ({best:,.1f} s); {pick} is the "
               f"nearest to the config's {start} within {slack:.0%} of it")
    elif pick == start:
        why = f"the config's {start} predicts the least time ({best:,.1f} s)"
    else:
        why = (f"{pick} predicts the least time ({best:,.1f} s); no value nearer the "
               f"config's {start} comes within {slack:.0%} of it")
    if why_up is not None:
        why += f"; {why_up}"
    return Quickest(pick, rates, times, why)
