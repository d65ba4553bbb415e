"""Peak resident memory of the processes a pipeline starts: each notebook's kernel, and whatever it starts.

The default run must fit a small machine (its peak resident memory stays within 8 GB), and a run-wide peak such
as GNU time's does not say which notebook reached it. `PeakMemory` watches the processes started below this one
while a notebook runs and gives the largest peak of any single one, as GNU time counts it: each process's own
high-water mark (`VmHWM` in /proc/<pid>/status), read every `interval` seconds while the process lives. The Linux
kernel keeps that mark, so a peak between two samples is not missed; only a peak reached in a process's last
`interval` seconds is. (The reaped children's `ru_maxrss` would cover those, but it is a maximum over every child
the runner ever had, so it cannot say which notebook's kernel reached it.) Linux only: elsewhere the peak is None.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

PROC = Path("/proc")


def high_water_kib(pid: int | str = "self") -> int | None:
    """The peak resident memory (KiB) a process has reached so far, from the Linux kernel's VmHWM; None when the
    process is gone or /proc has no such figure."""
    try:
        found = re.search(r"^VmHWM:\s+(\d+) kB", (PROC / str(pid) / "status").read_text(), re.MULTILINE)
    except OSError:  # exited between listing and reading, or no /proc
        return None
    return int(found.group(1)) if found else None


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (children, their children, ...), from /proc/<pid>/stat; [] without /proc."""
    parents: dict[int, list[int]] = {}
    for entry in PROC.glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # the name, in parentheses, may hold spaces
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


MAX_INTERVAL = 60.0  # seconds: a peak reached in a process's last interval is missed, so a longer one misses more


class PeakMemory:
    """`with PeakMemory() as peak: ...` then `peak.kib`: the largest peak resident memory of one process started below
    this one during the block (0 when it started none that /proc showed), or None off Linux. Processes already below
    this one when the block began (another test's child, say) are not counted. One object may measure several blocks
    one after the other (each `with` starts afresh), not two at once."""

    def __init__(self, interval: float = 0.2) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval <= MAX_INTERVAL:
            raise ValueError(
                f"PeakMemory(interval=...) must be a positive number of seconds, at most {MAX_INTERVAL:g} (how often "
                f"the processes are sampled), got {interval!r}"
            )
        self.interval = interval
        self.kib: int | None = None
        self._stop = threading.Event()
        self._seen = 0
        self._before: set[int] = set()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        for pid in descendants(os.getpid()):
            if pid not in self._before:  # a process already running when the block began is not the block's
                self._seen = max(self._seen, high_water_kib(pid) or 0)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PeakMemory:
        if self._thread is not None:
            raise RuntimeError("this PeakMemory is already measuring a block; use one PeakMemory per concurrent block")
        self.kib, self._seen = None, 0
        self._stop.clear()
        self._before = set(descendants(os.getpid()))
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample()
        self.kib = self._seen if PROC.joinpath("self", "status").is_file() else None
