"""Whether bf16 matmuls run on this CPU, found in a child process before gpusim first uses them.

Some CPUs (Xeons in VMs, typically) advertise AMX; oneDNN, which runs torch's
bf16 matmuls on the CPU, then picks its AMX kernels, and the tile
instructions fault: the process dies by SIGILL (exit 132) with no message.
oneDNN reads `ONEDNN_MAX_CPU_ISA` once, when it is first used, so a lower ISA
set before then avoids the fault; set later, it does nothing.

So before gpusim first runs bf16 on a CPU, `prepare()` asks a short child
process whether a bf16 matmul (and a Linear layer's forward and backward
under autocast, as the learner runs them) survives: with the user's
`ONEDNN_MAX_CPU_ISA` if set, else with oneDNN's own choice and, if that
faults, with each lower ISA in turn. The answer is cached per machine
(keyed by CPU model, flags and torch version) in gpusim's cache folder.
Where oneDNN's own choice faults, `prepare()` sets the highest ISA that
works and says so in one line; it never falls back to fp32 by itself.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass

from gpusim.errors import GpusimError

ISA_VAR = "ONEDNN_MAX_CPU_ISA"
# below AMX, highest first: oneDNN's names (its documentation, "CPU dispatcher control")
LOWER_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE", "AVX2")
# tests only: ISA settings ("default" = unset) under which the probe child kills itself
# by SIGILL, as a faulting CPU would; "*" = every setting
FAKE_FAULT_VAR = "GPUSIM_TEST_BF16_FAULT"
PROBE_TIMEOUT_S = 120
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx_ne_convert", "avx512f")

PROBE_SOURCE = f"""
import os, signal
faults = [s for s in os.environ.get({FAKE_FAULT_VAR!r}, "").split(",") if s]
if "*" in faults or os.environ.get({ISA_VAR!r}, "default") in faults:
    os.kill(os.getpid(), signal.SIGILL)
import torch
torch.set_num_threads(1)
a = torch.randn(64, 128, dtype=torch.bfloat16)
b = torch.randn(128, 256, dtype=torch.bfloat16)
(a @ b).float().sum().item()
layer = torch.nn.Linear(128, 256)
with torch.autocast("cpu", dtype=torch.bfloat16):
    out = layer(torch.randn(64, 128))
out.float().sum().backward()
print("bf16 ok")
"""


class Bf16Unavailable(GpusimError):
    """bf16 cannot run on this CPU as configured: the run stops before it starts."""


@dataclass(frozen=True)
class ProbeResult:
    """What the probe found: per ISA setting tried ("default" = oneDNN's own choice, or the
    user's ONEDNN_MAX_CPU_ISA), "ok", "SIGILL" or a short reason."""
    outcomes: dict
    user_isa: str | None

    @property
    def default_works(self) -> bool:
        return self.outcomes.get("default") == "ok"

    @property
    def working_isa(self) -> str | None:
        """The ISA to set where the default faults: the highest that works, or None."""
        return next((isa for isa in LOWER_ISAS if self.outcomes.get(isa) == "ok"), None)

    @property
    def any_works(self) -> bool:
        return self.default_works or self.working_isa is not None


def cpu_identity() -> dict:
    """CPU model and its bf16-related flags (Linux: /proc/cpuinfo)."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == (platform.processor() or platform.machine()):
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = value.split()
    return {"model": model, "flags": sorted(flags),
            "bf16_flags": [f for f in BF16_FLAGS if f in flags]}


def run_probe(isa: str | None) -> str:
    """One child process: "ok", "SIGILL", or why it failed otherwise."""
    env = dict(os.environ)
    env.pop(ISA_VAR, None)
    if isa is not None:
        env[ISA_VAR] = isa
    try:
        done = subprocess.run([sys.executable, "-c", PROBE_SOURCE], env=env, text=True,
                              capture_output=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"no answer within {PROBE_TIMEOUT_S} s"
    if done.returncode == 0 and "bf16 ok" in done.stdout:
        return "ok"
    return signal_or_reason(done.returncode, done.stderr)


def signal_or_reason(returncode: int, stderr: str = "") -> str:
    if returncode == -signal.SIGILL or returncode == 128 + signal.SIGILL:
        return "SIGILL"
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"exit {returncode}" + (f": {lines[-1][:160]}" if lines else "")


def _cache_key(user_isa: str | None) -> str:
    import torch
    ident = cpu_identity()
    parts = [ident["model"], " ".join(ident["flags"]), torch.__version__, user_isa or "",
             os.environ.get(FAKE_FAULT_VAR, "")]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _cache_file():
    from gpusim.cache import cache_root
    return cache_root() / "cpu_bf16.json"


def _read_cache() -> dict:
    try:
        return json.loads(_cache_file().read_text())
    except (OSError, ValueError, GpusimError):
        return {}


def _write_cache(key: str, result: ProbeResult):
    try:
        from gpusim.cache import atomic_write
        entries = _read_cache()
        entries[key] = asdict(result)
        atomic_write(_cache_file(), json.dumps(entries, indent=1, sort_keys=True))
    except (OSError, GpusimError):
        pass  # an unwritable cache costs a probe next time, nothing more


_memo: dict = {}


def probe(user_isa: str | None = None, use_cache: bool = True) -> ProbeResult:
    """What runs here: the default (or the user's ISA setting), then lower ISAs if it faults."""
    key = _cache_key(user_isa)
    if use_cache:
        if key in _memo:
            return _memo[key]
        saved = _read_cache().get(key)
        if isinstance(saved, dict) and isinstance(saved.get("outcomes"), dict):
            _memo[key] = ProbeResult(saved["outcomes"], saved.get("user_isa"))
            return _memo[key]
    outcomes = {"default": run_probe(user_isa)}
    if outcomes["default"] != "ok" and user_isa is None:
        for isa in LOWER_ISAS:
            outcomes[isa] = run_probe(isa)
            if outcomes[isa] == "ok":
                break
    result = _memo[key] = ProbeResult(outcomes, user_isa)
    _write_cache(key, result)
    return result


def verify_in_this_process() -> str:
    """Whether a bf16 matmul survives in this process's own state (oneDNN may already be
    initialised here): run it in a forked copy. "ok", "SIGILL" or a reason."""
    if not hasattr(os, "fork"):
        return "ok"  # no fork (Windows): the probe's answer stands
    pid = os.fork()
    if pid == 0:  # the copy: any outcome ends in os._exit, never back into the caller
        code = 1
        try:
            import faulthandler  # the parent reports the outcome: no dump from the copy
            faulthandler.disable()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            faults = [s for s in os.environ.get(FAKE_FAULT_VAR, "").split(",") if s]
            if "in-process" in faults:  # tests: oneDNN already fixed on a faulting ISA
                os.kill(os.getpid(), signal.SIGILL)
            import torch
            torch.set_num_threads(1)
            a = torch.ones(16, 32, dtype=torch.bfloat16)
            (a @ a.T).float().sum().item()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return signal_or_reason(-os.WTERMSIG(status))
    return "ok" if os.WEXITSTATUS(status) == 0 else f"exit {os.WEXITSTATUS(status)}"


_prepared: dict = {}


def prepare(announce=print) -> str:
    """Make bf16 matmuls safe in this process, or raise Bf16Unavailable; returns the ISA line.

    Call it before the process's first bf16 op on the CPU (gpusim's learner
    does, when it resolves `trainer.precision`). The user's ONEDNN_MAX_CPU_ISA
    is respected; without it, an ISA is set only where oneDNN's own choice
    faults, with one line through `announce`.
    """
    if "line" in _prepared:
        return _prepared["line"]
    user_isa = os.environ.get(ISA_VAR) or None
    result = probe(user_isa)
    if user_isa is not None:
        if not result.default_works:
            raise Bf16Unavailable(f"bf16 matmuls fail on this CPU with {ISA_VAR}={user_isa} "
                                  f"({result.outcomes['default']}): set a lower ISA, or set "
                                  "trainer.precision=fp32")
        line = f"gpusim: bf16 on the CPU with {ISA_VAR}={user_isa} (your setting)"
    elif result.default_works:
        line = "gpusim: bf16 on the CPU with oneDNN's own ISA choice"
    else:
        isa = result.working_isa
        if isa is None:
            tried = ", ".join(f"{k}: {v}" for k, v in result.outcomes.items())
            raise Bf16Unavailable(f"no bf16 path works on this CPU ({tried}); "
                                  "set trainer.precision=fp32")
        os.environ[ISA_VAR] = isa
        here = verify_in_this_process()
        if here != "ok":
            del os.environ[ISA_VAR]
            raise Bf16Unavailable(f"bf16 matmuls fault in this process ({here}): oneDNN was "
                                  "already in use before gpusim could limit its ISA; start "
                                  f"the process with {ISA_VAR}={isa}, or set "
                                  "trainer.precision=fp32")
        line = (f"gpusim: bf16 matmuls fault on this CPU's default oneDNN path "
                f"({result.outcomes['default']}); using {ISA_VAR}={isa}")
    _prepared["line"] = line
    if announce is not None:
        announce(line)
    return line


def doctor_rows() -> list:
    """(label, value) rows for `python -m gpusim.doctor`."""
    ident = cpu_identity()
    user_isa = os.environ.get(ISA_VAR) or None
    result = probe(user_isa)
    if result.default_works:
        state = "works" + (f" with {ISA_VAR}={user_isa}" if user_isa else " (oneDNN's own ISA)")
    elif result.working_isa:
        state = (f"faults on oneDNN's own ISA ({result.outcomes['default']}); works with "
                 f"{ISA_VAR}={result.working_isa}, which gpusim sets for bf16 runs")
    else:
        state = "does not work: " + ", ".join(f"{k}: {v}" for k, v in result.outcomes.items())
    return [("CPU", ident["model"]),
            ("CPU bf16 flags", " ".join(ident["bf16_flags"]) or "none"),
            ("CPU bf16 matmul", state)]
