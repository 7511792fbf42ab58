"""check_env's report: `Check`, one check's outcome (PASS, FAIL, WARN or SKIP, and its
line), `CheckResult`, the checks in order, and `CHECKS`, that order."""
from __future__ import annotations

from dataclasses import dataclass, field

CHECKS = ("attributes", "reset", "seeding", "step", "finite", "auto_reset", "coverage",
          "races", "static_races", "reference", "determinism", "backends")


@dataclass
class Check:
    """One check's outcome. `skipped` checks count as ok, and so do warnings (`warning`:
    something the check could not see, such as a path the rollout never took)."""
    name: str
    ok: bool
    message: str
    skipped: bool = False
    warning: bool = False
    fault: bool = False  # failed on an index out of bounds (kernel_replay.KernelFault)

    @property
    def status(self) -> str:
        if self.skipped:
            return "SKIP"
        return ("WARN" if self.warning else "PASS") if self.ok else "FAIL"

    def __str__(self):
        return f"{self.status} {self.name}: {self.message}"


@dataclass
class CheckResult:
    """The checks in order; `ok` (and truth value) is true when none failed."""
    env_name: str
    checks: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list:
        return [c for c in self.checks if not c.ok]

    @property
    def warnings(self) -> list:
        return [c for c in self.checks if c.warning]

    @property
    def names(self) -> tuple:
        return tuple(c.name for c in self.checks)

    def __getitem__(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check named '{name}' (checks: {', '.join(self.names)})")

    def __iter__(self):
        return iter(self.checks)

    def __len__(self):
        return len(self.checks)

    def __bool__(self):
        return self.ok

    def __str__(self):
        return "\n".join(str(c) for c in self.checks)
