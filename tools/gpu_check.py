"""`make gpu-check OUT=<folder>`: the repository's CUDA path measured in at most 8 minutes by one command, built and
rehearsed on a CPU for the rare GPU machine (lent for about 15 minutes, minutes to start, no registry, no hub).

    python tools/gpu_check.py --out DIR [--size auto|tiny|full] [--only PART ...] [--wheels DIR]
                              [--limit PART=SECONDS ...] [--notebooks NN ...] [--work DIR]

The parts (`gpu_parts.py`), in this order: the figures the plan needs first, the slowest last:

    environment    GPU, memory, driver; torch, CUDA, cuDNN, NCCL; bf16; flash-attention; the bf16 GEMM; libraries
    gpu_tests      pytest -m gpu tests/test_gpu.py
    preflight_05b  the preflight's probe of params/c2llm-0.5b.yaml at its full shapes, beside the plan's figures
    encode         encode_bench on the 0.5B architecture at 2,048 tokens: PMA against last-token pooling
    profile        torch.profiler over one training step of the 0.5B recipe: where the step's time goes
    preflight_7b   the same probe for params/c2llm-7b.yaml (GradCache), its memory step timed
    smoke          notebooks 01-05 of params/smoke.yaml on CUDA through papermill

Each part runs in a process group of its own, under its own time limit (`LIMITS`): a part that hangs is killed with
everything it started (a papermill kernel, a probe), a part that crashes (CUDA included) ends its own process, and
either is reported by name with its error while the others still run. The seconds a part leaves unused go to the
parts after it, and the limits (with the wheels' install) sum to 480 s, so the whole stays within 8 minutes. The exit
status is 1 when a part failed, timed out or was not run, else 0.

OUT receives four files (a device machine returns at most 8): `gpu_check.json` (every figure, the statuses, device,
versions, commit), `gpu_check.md` (the summary: each measured figure beside the computed one), `profile.md` (the
top kernels) and `gpu_check.log` (every part's output). Scratch (the smoke run, the benchmark's files, the parts'
results) lives in a temporary folder (`--work`), removed at the end.

On a CPU (`--size auto` there, `--size tiny` anywhere) every part runs at tiny sizes (the tiny random model, length
64, 2 rows of K = 2; notebooks 01-02 of the smoke run), the CUDA-only part (gpu_tests) reports "skipped: no CUDA",
and the figures rehearse the code, measuring nothing: `make test` runs it (tests/test_gpu_check.py), so the script
cannot rot between the days a GPU is available.

The GPU machine has no registry and the repository is not pip-installed there: `--wheels DIR` (`make gpu-check`
passes `.gpu-wheels/`, filled here by `make gpu-wheels`) installs the wheels first (`pip install --no-index --no-deps
--target`), and that folder and this repository go first on every part's PYTHONPATH.

C2LLM_GPU_CHECK_FAIL=part[,part] makes those parts raise and C2LLM_GPU_CHECK_HANG=part[,part] makes them hang: the
tests break the check on purpose with them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gpu_parts
from gpu_parts import NO_CUDA, PARTS, REPO

BUDGET_S = 480  # the whole check: 8 minutes of a GPU machine's 15
WHEELS_S = 30  # pip install --no-index of the carried wheels (part of the budget)
LIMITS = {  # seconds per part; with WHEELS_S they sum to BUDGET_S on a GPU
    "full": {
        "environment": 25,
        "gpu_tests": 45,
        "preflight_05b": 70,
        "encode": 45,
        "profile": 40,
        "preflight_7b": 125,
        "smoke": 100,
    },
    "tiny": {
        "environment": 60,
        "gpu_tests": 90,
        "preflight_05b": 120,
        "encode": 90,
        "profile": 90,
        "preflight_7b": 120,
        "smoke": 240,
    },
}
SITE = Path(tempfile.gettempdir()) / "c2llm-gpu-site"  # where the carried wheels are installed
OK = ("ok", "skipped: no CUDA")  # statuses that are not failures


def part_env(site: Path | None) -> dict[str, str]:
    """Every part's environment: the installed wheels and this repository first on the path (and the wheels' Jupyter
    data: `pip install --target` puts it beside them, where Jupyter does not look), no hub, unbuffered."""
    env = dict(os.environ)
    paths = [str(site)] if site else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(REPO), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    if site:  # the wheels' data files (nbconvert's templates for the notebooks' HTML copies, the kernel spec)
        env["C2LLM_GPU_SITE"] = str(site)  # the environment part checks the wheels' needs against this machine
        jupyter = [str(site / "share" / "jupyter"), *([env["JUPYTER_PATH"]] if env.get("JUPYTER_PATH") else [])]
        env["JUPYTER_PATH"] = os.pathsep.join(jupyter)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env[var] = "1"  # no hub is reachable: a hub call would retry for ~20 s
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def install_wheels(folder: Path, site: Path, log: Path, limit: float) -> dict[str, Any]:
    """`pip install --no-index --no-deps --target site folder/*.whl`; its status, seconds and wheel count."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        return {
            "status": "failed",
            "seconds": 0.0,
            "error": f"no wheels in {folder}: run `make gpu-wheels` where a "
            "registry is reachable, and carry the folder",
        }
    shutil.rmtree(site, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--upgrade",
        "--target",
        str(site),
        *map(str, wheels),
    ]
    tick = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n===== wheels: {len(wheels)} from {folder} into {site} =====\n")
        out.flush()
        try:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=limit)
        except subprocess.TimeoutExpired:
            return {"status": "timed out", "seconds": limit, "error": f"pip did not finish within {limit:.0f} s"}
    seconds = time.monotonic() - tick
    if done.returncode:
        return {"status": "failed", "seconds": seconds, "error": f"pip exited with {done.returncode} (see the log)"}
    return {"status": "ok", "seconds": seconds, "wheels": len(wheels), "bytes": sum(w.stat().st_size for w in wheels)}


def kill_group(proc: subprocess.Popen) -> None:
    """Ends a part and everything it started (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def log_tail(log: Path, start: int, lines: int = 8) -> str:
    with log.open("rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    return "\n".join(text.strip().splitlines()[-lines:])


def run_part(
    name: str, size: str, limit: float, out: Path, work: Path, env: dict[str, str], notebooks: list[str] | None = None
) -> dict[str, Any]:
    """One part in its own process group, killed at `limit` seconds; its result, or why it has none."""
    log, result = out / "gpu_check.log", work / f"part-{name}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--part",
        name,
        "--size",
        size,
        "--out",
        str(out),
        "--work",
        str(work),
        "--result",
        str(result),
        "--seconds",
        f"{limit:.1f}",
    ] + (["--notebooks", *notebooks] if notebooks else [])
    start = log.stat().st_size if log.is_file() else 0
    tick = time.monotonic()
    with log.open("a") as stream:
        stream.write(f"\n===== {name} (limit {limit:.0f} s) =====\n")
        stream.flush()
        proc = subprocess.Popen(cmd, stdout=stream, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_group(proc)  # a hung part, or what a finished one left running (a kernel, a probe)
    seconds = time.monotonic() - tick
    found = json.loads(result.read_text()) if result.is_file() else {}
    entry = {
        "status": found.get("status", "failed"),
        "seconds": round(seconds, 1),
        "limit_s": round(limit),
        "figures": found.get("figures", {}),
        "error": found.get("error", ""),
    }
    if timed_out:
        entry.update(
            status="timed out",
            error=f"{name} did not finish within {limit:.0f} s and was stopped (its "
            f"process group killed); its last output: {log_tail(log, start)}",
        )
    elif not found:
        why = f"signal {-proc.returncode}" if proc.returncode < 0 else f"status {proc.returncode}"
        entry["error"] = f"{name} ended ({why}) without a result; its last output: {log_tail(log, start)}"
    return entry


def commit() -> dict[str, Any]:
    """The repository's commit and dirty flag; C2LLM_COMMIT, where set, names it (a copy sent to a GPU machine may carry
    another checkout's .git, or none)."""
    if os.environ.get("C2LLM_COMMIT"):
        return {"commit": os.environ["C2LLM_COMMIT"], "dirty": None}
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if sha.returncode == 0:
            return {"commit": sha.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"commit": os.environ.get("C2LLM_COMMIT") or "unknown (no git here: set C2LLM_COMMIT)", "dirty": None}


def cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def check(
    out: Path,
    size: str,
    only: list[str],
    wheels: Path | None,
    limits: dict[str, float],
    work: Path,
    notebooks: list[str] | None = None,
) -> int:
    """Every chosen part; the report written to `out`; 1 when a part failed, timed out or was not run."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.log").write_text("")
    tick = time.monotonic()
    report: dict[str, Any] = {
        "kind": "c2llm-gpu-check",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "size": size,
        **commit(),
        "budget_s": sum(limits[p] for p in only),
        "parts": {},
    }
    site = None
    slack = 0.0
    if wheels is not None:
        report["wheels"] = install_wheels(wheels, SITE, out / "gpu_check.log", WHEELS_S)
        site = SITE if report["wheels"]["status"] == "ok" else None
        slack = max(0.0, WHEELS_S - report["wheels"]["seconds"])
    env = part_env(site)
    for name in only:
        limit = limits[name] + slack  # what the parts before left unused
        entry = run_part(name, size, limit, out, work, env, notebooks)
        slack = max(0.0, limit - entry["seconds"])
        report["parts"][name] = entry
        print(
            f"[{name}] {entry['status']} in {entry['seconds']:.0f} s"
            + (f": {entry['error']}" if entry["error"] and entry["status"] not in OK else ""),
            flush=True,
        )
    report["seconds"] = round(time.monotonic() - tick, 1)
    failed = [n for n, e in report["parts"].items() if e["status"] not in OK]
    if report.get("wheels", {}).get("status", "ok") != "ok":
        failed.insert(0, "wheels")
    report["failed"] = failed
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "gpu_check.md").write_text(summary(report))
    print(
        f"{len(report['parts'])} parts in {report['seconds']:.0f} s; "
        + (f"failed: {', '.join(failed)}" if failed else "none failed")
        + f"; figures in {out}"
    )
    return 1 if failed else 0


# the report --------------------------------------------------------------------------------------------------------
def fmt(value: Any, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def summary(report: dict[str, Any]) -> str:
    """gpu_check.md: one line per part, then each preflight's measured figures beside the plan's."""
    parts = report["parts"]
    env = parts.get("environment", {}).get("figures", {})
    device = env.get("gpu") if env.get("gpu") != NO_CUDA else "a CPU (no CUDA)"
    lines = [
        f"# make gpu-check ({report['size']} sizes) on {device or 'a device not recorded'}",
        "",
        f"Commit {report['commit']}{' (dirty)' if report.get('dirty') else ''}; {report['started']}; "
        f"{report['seconds']:.0f} s of a {report['budget_s']:.0f} s budget; torch {env.get('torch')}, CUDA "
        f"{env.get('cuda_build')}, driver {env.get('driver')}, flash-attn {env.get('flash_attn')}.",
        "",
    ]
    if report["size"] == "tiny":
        lines += ["A rehearsal at tiny sizes: the figures exercise the code and measure nothing.", ""]
    if "wheels" in report:
        w = report["wheels"]
        lines += [
            f"Wheels: {w['status']} ({w.get('wheels', 0)} installed in {w['seconds']:.0f} s)"
            + (f": {w['error']}" if w.get("error") else ""),
            "",
        ]
    lines += ["| part | status | seconds (limit) | error |", "|---|---|---|---|"]
    for name, e in parts.items():
        error = e["error"].splitlines()[0][:200].replace("|", "/") if e["error"] else ""
        lines.append(f"| {name} | {e['status']} | {e['seconds']:.0f} ({e['limit_s']}) | {error} |")
    for name in ("preflight_05b", "preflight_7b"):
        f = parts.get(name, {}).get("figures", {})
        if f:
            lines += ["", *preflight_lines(name, f)]
    enc = parts.get("encode", {}).get("figures", {})
    if enc:
        lines += [
            "",
            f"**encode** ({enc['backbone']}, {enc['texts']} texts of {enc['max_length']} tokens, batch "
            f"{enc['batch_size']}): {fmt(enc['encode_tokens_per_s_sorted'], ',.0f')} tokens/s; PMA against "
            f"last-token pooling: {fmt(100 * enc['pma_overhead_end_to_end'], '.2f')} % end to end, "
            f"{fmt(100 * enc['pma_overhead_isolated'], '.3f')} % the pooler alone (the paper: PMA costs "
            "nothing).",
        ]
    prof = parts.get("profile", {}).get("figures", {})
    if prof:
        lines += [
            "",
            "**profile**: see profile.md; kernel time by kind: "
            + ", ".join(f"{k} {v:.0%}" for k, v in prof["by_kind"].items())
            + (
                f"; no kernel ran during {prof['no_kernel_share']:.0%} of the step"
                if prof.get("no_kernel_share") is not None
                else ""
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"


def preflight_lines(name: str, f: dict[str, Any]) -> list[str]:
    plan, mem, speed = f["plan"], f.get("memory", {}), f.get("speed", {})
    setting = ("checkpointing" if f["gradient_checkpointing"] else "no checkpointing") + (
        ", GradCache" if f["grad_cache"] else ""
    )
    rows = [
        f"**{name}** ({f['measured_on']}, {f['dtype']}, {f['texts_per_device']} texts of {f['max_length']} tokens "
        f"per device, K = {f['negatives']}, {setting}):",
        "",
        "| figure | measured | computed (the plan) |",
        "|---|---|---|",
        f"| peak memory per device (GB) | {fmt(mem.get('peak_gb'), '.1f')} | {fmt(plan['memory_gb'], '.1f')} |",
        f"| FLOPs per device step (scale.py's rule: the two agree) | {fmt(speed.get('flops_per_step'), '.3e')} | "
        f"{fmt(plan['flops_per_device_step'], '.3e')} |",
        f"| seconds per step | {fmt(speed.get('seconds_per_step'), '.2f')} | - |",
        f"| real tokens/s per device | {fmt(speed.get('tokens_per_second'), ',.0f')} | - |",
        f"| MFU vs 989 TFLOP/s, recomputation counted | {fmt(speed.get('mfu_vs_datasheet'), '.1%')} | "
        f"{plan['mfu']:.0%} (assumed){'; the goal: at least 40 %' if name == 'preflight_05b' else ''} |",
        f"| MFU vs 989 TFLOP/s, model FLOPs only | {fmt(speed.get('model_mfu_vs_datasheet'), '.1%')} | - |",
        f"| MFU vs this GPU's measured bf16 GEMM ({fmt(speed.get('gemm_tflops'), '.0f')} TFLOP/s) | "
        f"{fmt(speed.get('mfu_vs_measured_gemm'), '.1%')} | - |",
        f"| the paper's run on 8 such GPUs (hours; {plan['steps']:,} steps) | "
        f"{fmt(speed.get('hours_8_gpus'), '.1f')} | {fmt(plan['hours_8_gpus'], '.1f')} |",
    ]
    if "inference" in f:
        inference = f["inference"]
        rank = inference.get("adapter_rank")
        form = "the training's adapter" if rank is None else f"merged adapter of rank {rank}" if rank else "no adapter"
        rows.append(f"| inference tokens/s ({inference['texts']} texts, {form}) | "
                    f"{fmt(inference['tokens_per_second'], ',.0f')} | - |")  # fmt: skip
        if "untrained_tokens_per_second" in inference:
            rows.append(f"| inference tokens/s, the untrained baselines' backbone | "
                        f"{fmt(inference['untrained_tokens_per_second'], ',.0f')} | - |")  # fmt: skip
    return rows


def parse_limits(given: list[str], size: str) -> dict[str, float]:
    limits = dict(LIMITS[size])
    for item in given:
        name, _, seconds = item.partition("=")
        if name not in limits or not seconds.replace(".", "", 1).isdigit():
            raise SystemExit(f"--limit takes PART=SECONDS with PART one of {', '.join(PARTS)}, got {item!r}")
        limits[name] = float(seconds)
    return limits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder the figures are written to")
    parser.add_argument(
        "--size",
        choices=["auto", "tiny", "full"],
        default="auto",
        help="full: the recipes' shapes (a GPU); tiny: the rehearsal's; auto: full where CUDA is",
    )
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), metavar="PART")
    parser.add_argument("--wheels", type=Path, default=None, help="a folder of wheels to install first (--no-index)")
    parser.add_argument("--limit", nargs="+", default=[], metavar="PART=SECONDS", help="another time limit")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one, removed)")
    parser.add_argument(
        "--notebooks",
        nargs="+",
        default=None,
        metavar="NN",
        help="the smoke run's notebooks (default: 01-05 full, 01-02 tiny)",
    )
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # a part's own process
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:
        return gpu_parts.run_one(args.part, args.size, args.out, args.work, args.result, args.seconds, args.notebooks)
    size = args.size if args.size != "auto" else ("full" if cuda_present() else "tiny")
    work = args.work or Path(tempfile.mkdtemp(prefix="c2llm-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    order = [p for p in PARTS if p in args.only]
    try:
        return check(args.out, size, order, args.wheels, parse_limits(args.limit, size), work, args.notebooks)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
