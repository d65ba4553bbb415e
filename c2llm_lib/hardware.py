"""The machine a run computes on: the CPU and its GEMM speed, device and dtype (`dtype: auto`: bf16 on CUDA, on a CPU
the faster of bf16 and fp32 by a cached probe: docs/encoder.md), and peak memory.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch

CACHE = Path(os.environ.get("C2LLM_CACHE", Path.home() / ".cache" / "c2llm")) / "cpu-dtype.json"
CAPABILITIES = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2", "fma")  # /proc/cpuinfo flag names
ISA_LIMITS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")  # what the kernels may use
BF16_MARGIN = 1.2  # bf16 must measure this much faster than fp32 to be chosen (it costs precision)
CONFIRM_SIZE, CONFIRM_SECONDS = 256, 0.05  # the short measurement that must not contradict a cached entry's choice
CONFIRM_TRIES = 2  # short measurements in a row that must contradict it to refute it
CONFIRM_FACTOR = 1.5  # how far past the margin that measurement must land to refute the entry (its noise is large)


def cpu_info() -> dict[str, Any]:
    """{"model", "capabilities", "threads", "isa_limit" ("" when the environment sets no instruction-set limit)}."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
    limit = ", ".join(f"{k}={os.environ[k]}" for k in ISA_LIMITS if os.environ.get(k))
    return {"model": model, "capabilities": [f for f in CAPABILITIES if f in flags],
            "threads": torch.get_num_threads(), "isa_limit": limit}  # fmt: skip


def gemm_gflops(dtype: torch.dtype, size: int = 1024, seconds: float = 0.5, device: str = "cpu") -> float:
    """Measured GFLOP/s of a (size x size) matmul in `dtype`; its generator leaves torch's global one alone."""
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, generator=generator).to(dtype)  # (n, n)
    b = torch.randn(size, size, device=device, generator=generator).to(dtype)  # (n, n)
    for _ in range(2):
        a @ b
    count, start = 0, time.perf_counter()
    while True:
        a @ b
        count += 1
        if device != "cpu":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2 * size**3 * count / elapsed / 1e9


def _probe_key(info: dict[str, Any]) -> str:
    key = f"{info['model']}|{','.join(info['capabilities'])}|{info['threads']}|torch {torch.__version__}"
    return key + (f"|{info['isa_limit']}" if info.get("isa_limit") else "")


PROBED = ("bfloat16", "float32")  # the dtypes a cache entry holds GFLOP/s for


def entry_problem(entry: Any) -> str:
    """Why a cached probe entry cannot be trusted ('' when it can)."""
    if not isinstance(entry, dict):
        return f"the entry is a {type(entry).__name__}, not a mapping of dtype names to GFLOP/s"
    if sorted(entry) != sorted(PROBED):
        return f"the entry names the dtypes {sorted(map(str, entry))}, not {list(PROBED)}"
    bad = {k: v for k, v in entry.items() if isinstance(v, bool) or not isinstance(v, (int, float))
           or not math.isfinite(v) or v <= 0}  # fmt: skip
    return f"its figures {bad} are not finite positive GFLOP/s" if bad else ""


def choice(figures: dict[str, float]) -> torch.dtype:
    """bf16 where its GEMM measures at least BF16_MARGIN times fp32's, else fp32."""
    return torch.bfloat16 if figures["bfloat16"] >= BF16_MARGIN * figures["float32"] else torch.float32


def contradiction(entry: dict[str, float], quick: dict[str, float]) -> str:
    """Why a short measurement (`quick`) refutes a cached entry's choice ('' when it does not)."""
    ratio = quick["bfloat16"] / quick["float32"]
    chosen = choice(entry)
    refuted = ratio < BF16_MARGIN / CONFIRM_FACTOR if chosen == torch.bfloat16 else ratio > BF16_MARGIN * CONFIRM_FACTOR
    if not refuted:
        return ""
    return (
        f"its figures (bf16 {entry['bfloat16']:.0f} vs fp32 {entry['float32']:.0f} GFLOP/s) choose "
        f"{str(chosen).removeprefix('torch.')}, but this process measures bf16 at {ratio:.2f}x fp32's speed"
    )


def confirm(entry: dict[str, float]) -> str:
    """`contradiction` by short measurements made now; refuted only when CONFIRM_TRIES in a row contradict it."""
    why = ""
    for _ in range(CONFIRM_TRIES):
        quick = {name: gemm_gflops(getattr(torch, name), size=CONFIRM_SIZE, seconds=CONFIRM_SECONDS) for name in PROBED}
        why = contradiction(entry, quick)
        if not why:
            return ""
    return why


def read_cache(cache: Path | None) -> tuple[dict[str, Any], str]:
    """(the cache's entries, why the file cannot be used or ''); a missing file is an empty cache."""
    if cache is None or not cache.exists():
        return {}, ""
    try:
        cached = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # unreadable, not UTF-8, not JSON
        return {}, f"the file cannot be read as JSON ({type(err).__name__}: {str(err)[:100]})"
    if not isinstance(cached, dict):
        return {}, f"the file holds a {type(cached).__name__}, not a mapping of CPUs to probe figures"
    return cached, ""


def cpu_gemm_figures(cache: Path | None = CACHE) -> dict[str, float]:
    """{"float32": GFLOP/s, "bfloat16": GFLOP/s} of this CPU, probed once per machine and cached; an untrusted or
    contradicted entry is probed again and named in a warning."""
    key = _probe_key(cpu_info())
    cached, problem = read_cache(cache)
    entry = cached.get(key)
    problem = problem or (entry_problem(entry) if entry is not None else "")
    if problem:
        warnings.warn(f"{cache}: {problem}; probing this CPU's GEMM speed again", stacklevel=2)
    refuted = confirm(entry) if entry is not None and not problem else ""
    if entry is None or problem or refuted:
        fresh = {"float32": gemm_gflops(torch.float32), "bfloat16": gemm_gflops(torch.bfloat16)}
        if refuted and choice(fresh) != choice(entry):  # not noise: the entry chose what this CPU does not
            warnings.warn(f"{cache}: the entry for this CPU is not what it measures: {refuted}; probed again: bf16 "
                          f"{fresh['bfloat16']:.0f} vs fp32 {fresh['float32']:.0f} GFLOP/s", stacklevel=2)  # fmt: skip
        entry = fresh
        if cache is not None:
            try:  # written beside and renamed: a symlink in its place is replaced, never written through
                cache.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps({**cached, key: entry}, indent=1))
                os.replace(tmp, cache)
            except OSError:  # a read-only home: probe again next time
                pass
    return {"float32": float(entry["float32"]), "bfloat16": float(entry["bfloat16"])}


def cpu_dtype(cache: Path | None = CACHE) -> tuple[torch.dtype, str]:
    """(bf16 or fp32, why) for this CPU: whichever GEMM runs faster here."""
    info = cpu_info()
    figures = cpu_gemm_figures(cache)
    fp32, bf16 = figures["float32"], figures["bfloat16"]
    chosen = choice(figures)
    flags = ", ".join(info["capabilities"]) or "none of " + ", ".join(CAPABILITIES)
    flags += f"; kernels limited by {info['isa_limit']}" if info.get("isa_limit") else ""
    why = (f"CPU {info['model']} ({flags}): GEMM {bf16:.0f} GFLOP/s in bf16 vs {fp32:.0f} in fp32 "
           f"on {info['threads']} threads, so {str(chosen).removeprefix('torch.')}")  # fmt: skip
    return chosen, why


def auto_dtype(device: torch.device) -> tuple[torch.dtype, str]:
    """What `dtype: auto` means on `device`, and why."""
    if device.type == "cuda":
        return torch.bfloat16, "CUDA: bf16"
    if device.type == "cpu":
        return cpu_dtype()
    return torch.float32, f"{device.type}: float32"


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} was asked for, but CUDA is not available on this machine")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return auto_dtype(device)[0]
    return _DTYPES[name]


# peak memory ----------------------------------------------------------------------------------------------------------
PROC = Path("/proc")


def high_water_kib(pid: int | str = "self") -> int | None:
    """A process's peak resident memory so far (KiB, Linux VmHWM); None when gone or without /proc."""
    try:
        found = re.search(r"^VmHWM:\s+(\d+) kB", (PROC / str(pid) / "status").read_text(), re.MULTILINE)
    except OSError:  # exited between listing and reading, or no /proc
        return None
    return int(found.group(1)) if found else None


def reset_peak_memory() -> None:
    """Starts a new peak-memory window: Linux's resident peak and CUDA's allocator peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # not Linux, or not allowed: only the whole-process peak is reported
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device: torch.device) -> int:
    """Peak bytes on `device` since `reset_peak_memory` (CUDA allocated, else resident; 0 off Linux)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return (high_water_kib() or 0) * 1024


def peak_memory() -> dict[str, float]:
    """Peak memory in GB: `peak_rss_gb` (whole process), `train_peak_rss_gb` since `reset_peak_memory` (Linux), and
    `peak_cuda_gb` where a GPU is in use."""
    import resource  # Unix only

    out = {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}  # ru_maxrss is in KiB on Linux
    window = high_water_kib()  # None off Linux
    if window is not None:  # the kernel's two counters update at different moments; the whole includes the window
        out["train_peak_rss_gb"] = window / 2**20
        out["peak_rss_gb"] = max(out["peak_rss_gb"], out["train_peak_rss_gb"])
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["peak_cuda_gb"] = peak_bytes(torch.device("cuda", torch.cuda.current_device())) / 2**30
    return out


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
    this one during the block (0 if none, None off Linux). One block at a time."""

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
