"""What a preflight reports: one `Check` per line (pass, warn or fail, the figure behind it, what to change), the
`Limits` a user or a test can impose on what the checks may use, and the `Report` as a table and as JSON.

Every figure says how it was obtained (`basis`): `measured` on this machine, `computed` from the recipe with the
formulas of `scale.py`, or `given` (a budget or an assumption stated in the message).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from c2llm_lib.runs import check_run_name

Status = Literal["pass", "warn", "fail"]
Basis = Literal["measured", "computed", "given"]
GROUPS = ("environment", "inputs", "memory", "speed", "writes", "processes")
KIND = "c2llm-preflight"  # marks a report file, so that a file of another kind is never overwritten
GiB = 2**30


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    group: str  # one of GROUPS
    name: str
    status: Status
    figure: str  # the number behind the status, with its unit
    message: str = ""  # what it means; for warn and fail, the setting to change and its value
    basis: Basis = "measured"
    values: dict[str, Any] = field(default_factory=dict)  # the figures as numbers, for the JSON

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"check group must be one of {GROUPS}, got {self.group!r}")
        if self.status not in ("pass", "warn", "fail"):
            raise ValueError(f"check status must be pass, warn or fail, got {self.status!r}")


def _positive(value: Any, name: str, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value <= 0:
        kind = "a positive whole number" if integer else "a positive number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")


@dataclass(frozen=True)
class Limits:
    """What the checks may use, where a user (a quota, a shared GPU) or a test imposes less than the machine has."""

    memory_gb: float | None = None  # the most one device (a GPU, or the host for a CPU run) may hold, GiB
    disk_gb: float | None = None  # the most the run may write, GiB, whatever the filesystems have free
    steps: int | None = None  # timed optimizer steps after the memory step (None: 2 on a GPU; 1 on a CPU, 0 after a
    # memory step longer than probe.FIRST_STEP_S)
    probe_timeout_s: float = 900.0  # the measurement child's time limit
    hub_timeout_s: float = 5.0  # per hub request (one request that finds no hub stops the others)

    def __post_init__(self) -> None:
        for name in ("memory_gb", "disk_gb"):
            if getattr(self, name) is not None:
                _positive(getattr(self, name), f"--{name.replace('_', '-')}")
        if self.steps is not None and (isinstance(self.steps, bool) or not isinstance(self.steps, int)
                                       or self.steps < 0):  # fmt: skip
            raise ValueError(f"--steps must be a whole number >= 0, got {self.steps!r}")
        _positive(self.probe_timeout_s, "probe_timeout_s")
        _positive(self.hub_timeout_s, "hub_timeout_s")


@dataclass
class Report:
    """Every check of one preflight, with what it ran on."""

    run: str
    params_file: str
    overlay: str | None
    sets: dict[str, Any]
    notebooks: list[str]
    started: str
    seconds: float = 0.0
    device: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    @property
    def status(self) -> Status:
        found = {c.status for c in self.checks}
        return "fail" if "fail" in found else "warn" if "warn" in found else "pass"

    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def to_json(self) -> dict[str, Any]:
        return {"kind": KIND, "version": 1, "status": self.status, **asdict(self),
                "measured": [f"{c.group}/{c.name}" for c in self.checks if c.basis == "measured"],
                "computed": [f"{c.group}/{c.name}" for c in self.checks if c.basis == "computed"],
                "given": [f"{c.group}/{c.name}" for c in self.checks if c.basis == "given"]}  # fmt: skip

    def table(self, width: int = 120) -> str:
        """The report as text: one line per check (status, group/name, figure), and under a warn or fail what to
        do; the basis of each figure in brackets."""
        name_width = max([len(f"{c.group}/{c.name}") for c in self.checks] + [10])
        lines = [f"preflight of {self.params_file}" + (f" with {self.overlay}" if self.overlay else "")
                 + f" (run {self.run!r}, notebooks {' '.join(n[:2] for n in self.notebooks)})"]  # fmt: skip
        for check in self.checks:
            label = f"{check.group}/{check.name}".ljust(name_width)
            lines.append(f"{check.status.upper():4}  {label}  {check.figure} [{check.basis}]")
            if check.message and check.status != "pass":
                lines += [" " * (8 + name_width) + part for part in _wrap(check.message, width - 8 - name_width)]
        counts = {s: sum(c.status == s for c in self.checks) for s in ("pass", "warn", "fail")}
        lines.append(f"{self.status.upper()}: {counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail "
                     f"in {self.seconds:.0f} s")  # fmt: skip
        return "\n".join(lines)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, max(40, width), break_long_words=False, break_on_hyphens=False) or [""]


def gib(nbytes: float) -> str:
    """Bytes as GiB with two decimals (or MiB below a tenth of a GiB)."""
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB / 10 else f"{nbytes / 2**20:.1f} MiB"


def duration(seconds: float) -> str:
    """Seconds as '42 s', '12.5 min', '19.0 h' or '18.4 days'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 96 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


PREFLIGHT_SUFFIX = ".preflight.json"


def save_preflight(outputs: str | Path, run: str, report: dict[str, Any]) -> Path:
    """Writes the preflight's report atomically to `<outputs>/<run>.preflight.json`, beside the run directory; a file
    of that name that is not a preflight report is refused, not overwritten."""
    check_run_name(run, "run name")
    outputs = Path(outputs)
    outputs.mkdir(parents=True, exist_ok=True)
    path = outputs / f"{run}{PREFLIGHT_SUFFIX}"
    if path.is_symlink() or path.exists():
        try:
            earlier = json.loads(path.read_text()) if path.is_file() and not path.is_symlink() else None
        except (OSError, ValueError):
            earlier = None
        if not isinstance(earlier, dict) or earlier.get("kind") != report.get("kind"):
            raise FileExistsError(f"{path} exists and is not a preflight report: not overwritten; move it away")
    tmp = outputs / f".{run}{PREFLIGHT_SUFFIX}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
