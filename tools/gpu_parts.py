"""The parts of `make gpu-check` (`gpu_check.py` runs each in a process of its own) and its summary.

Each part is a function of a `Context` returning (status, figures). What it measures comes from the library's own
measuring code, so that the check measures what the preflight, the benchmarks and the plan compute:

- the preflights: `preflight.device.subject` (random weights of the recipe's architecture on a GPU, no hub; the tiny
  model on a CPU), `preflight.device.probe_spec` at 8 processes (the recipe's per-device share of the global batch:
  256 / 8 = 32 rows, 288 texts of 1024 tokens) and `preflight.device.run_probes` (the probe's child: one memory step,
  timed steps, an inference batch, the GEMM peak); the plan's figures from `scale.plan` for the same recipe;
- encode: `benchmarks/encode_bench.py` (`--backbone random-0.5b --text-tokens 2048`);
- profile: `preflight.probe.build_encoder`, `trainer_for` and `largest_batch`, under torch.profiler;
- smoke: the runner itself (`python -m c2llm_lib.pipeline params/smoke.yaml --only ... --set device=cuda ...`).

MFU is given twice: against the bf16 GEMM this GPU measured in the same process (what the preflight reports), and
against the 989 TFLOP/s datasheet peak the plan assumes (`scale.H100_BF16_FLOPS`); both with the step's FLOPs by the
rule of `scale.py` (recomputation included), and as model FLOPs (forward and backward only, the usual MFU).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parent.parent
PARTS = ("environment", "gpu_tests", "preflight_05b", "encode", "profile", "preflight_7b", "smoke")
GPUS = 8  # the plan's machine: the per-device batch is the global batch's share of 8 GPUs
TINY_SETS = {
    "max_length": 64,
    "global_batch_size": 16,
    "num_negatives": 2,
    "eval_max_length": 128,
    "eval_batch_size": 4,
    "grad_cache_chunk": 4,
}  # global batch 16 / 8 devices = 2 rows per device
NO_CUDA = "skipped: no CUDA"
LIBRARIES = (
    "torch",
    "transformers",
    "peft",
    "sentence-transformers",
    "accelerate",
    "tokenizers",
    "safetensors",
    "numpy",
    "pandas",
    "pyarrow",
    "datasets",
    "mteb",
    "papermill",
    "nbclient",
    "ipykernel",
    "flash-attn",
    "triton",
)


@dataclass
class Context:
    size: str  # "full" or "tiny"
    out: Path  # the report folder (profile.md goes there)
    work: Path  # scratch
    seconds: float  # this part's time limit
    start: float
    notebooks: list[str] | None = None  # the smoke run's (None: its default for the size)

    @property
    def tiny(self) -> bool:
        return self.size == "tiny"

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# environment ---------------------------------------------------------------------------------------------------------
def version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed() -> dict[str, str]:
    from importlib import metadata

    return dict(sorted((d.metadata["Name"], d.version) for d in metadata.distributions() if d.metadata["Name"]))


def driver() -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown (no nvidia-smi)"


def environment(ctx: Context) -> tuple[str, dict[str, Any]]:
    """The machine and its software; the bf16 GEMM peak; pyproject's pins against what is installed (reported)."""
    import torch

    from c2llm_lib.model.backbone import flash_attention_available
    from tools.preflight.environment import check_versions
    from tools.preflight.probe import gemm_peak

    figures: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "flash_attn": version("flash-attn") or version("flash_attn") or "not installed",
        "libraries": {name: version(name) for name in LIBRARIES},
        "installed": installed(),  # every distribution: what tools/gpu-image.txt can record the versions of
    }
    if cuda():
        props = torch.cuda.get_device_properties(0)
        figures.update(
            gpu=props.name,
            gpus=torch.cuda.device_count(),
            memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            driver=driver(),
            cudnn=torch.backends.cudnn.version(),
            nccl=".".join(map(str, torch.cuda.nccl.version())),
            bf16=torch.cuda.is_bf16_supported(),
            flash_attention_2=flash_attention_available(),
            sdpa={
                "flash": torch.backends.cuda.flash_sdp_enabled(),
                "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
            },
            bf16_gemm_tflops=round(gemm_peak(torch.bfloat16, torch.device("cuda")) / 1e3, 1),
        )
    else:
        figures.update({k: NO_CUDA for k in ("gpu", "memory_gib", "driver", "cudnn", "nccl", "bf16", "sdpa")})
        figures["flash_attention_2"] = NO_CUDA
        figures["gemm_gflops_cpu"] = round(gemm_peak(torch.float32, torch.device("cpu")), 1)
    figures["wheel_needs"] = wheel_needs()
    pins = check_versions()  # jupyterlab, ipywidgets... are not carried: reported, not failed
    figures["pyproject_pins"] = {
        "status": pins.status,
        "figure": pins.figure,
        "problems": pins.values.get("problems", []),
    }
    problems = (figures["wheel_needs"] or {}).get("problems")
    if problems:
        raise PartFailed(f"the carried wheels need what this machine lacks: {'; '.join(problems)}", figures)
    return "ok", figures


def wheel_needs() -> dict[str, Any] | None:
    """Where the carried wheels were installed (`gpu_check.py --wheels`), their needs against the versions this machine
    has (`gpu_wheels.requirement_problems`, the check `make gpu-wheels` could only make by name where the image list
    records no version): a need unmet here fails this part, named, before the parts that would break on it."""
    if not os.environ.get("C2LLM_GPU_SITE"):
        return None
    from importlib import metadata

    import gpu_wheels
    from packaging.utils import canonicalize_name

    pins = gpu_wheels.read_list(gpu_wheels.WHEELS_LIST)
    requires, here = {}, {}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        if name in pins:
            requires[name] = dist.requires or []
        elif name:
            here[name] = dist.version
    problems, _ = gpu_wheels.requirement_problems(requires, pins, here)
    problems += [f"{name} was carried but is not installed" for name in sorted(set(pins) - set(requires))]
    return {"carried_found": len(requires), "carried_pinned": len(pins), "problems": problems}


# tests -------------------------------------------------------------------------------------------------------------
def gpu_tests(ctx: Context) -> tuple[str, dict[str, Any]]:
    """`pytest -m gpu tests/test_gpu.py` (the file holds every test marked gpu); counts and the failures' names."""
    junit = ctx.work / "gpu-tests.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        f"--junitxml={junit}",
        "tests/test_gpu.py",
    ]
    done = subprocess.run(cmd, cwd=REPO, timeout=max(10.0, ctx.left() - 5))
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures, skips = [], set()
    if junit.is_file():
        for case in ElementTree.parse(junit).iter("testcase"):
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            skipped = case.find("skipped")
            if bad is not None:
                counts["failed"] += 1
                failures.append(f"{case.get('name')}: {(bad.get('message') or '')[:300]}")
            elif skipped is not None:
                counts["skipped"] += 1
                skips.add((skipped.get("message") or "")[:120])
            else:
                counts["passed"] += 1
    figures = {**counts, "failures": failures, "skip_reasons": sorted(skips), "exit": done.returncode}
    if done.returncode not in (0, 5) or failures or not junit.is_file():
        raise RuntimeError(f"gpu tests failed (pytest exit {done.returncode}): {'; '.join(failures) or 'see the log'}")
    return ("ok" if cuda() else NO_CUDA), figures


# preflights --------------------------------------------------------------------------------------------------------
def preflight(ctx: Context, params: str, steps: int | None) -> tuple[str, dict[str, Any]]:
    """The preflight's probe of `params` at the recipe's per-device batch, beside the plan's computed figures."""
    from c2llm_lib.hardware import resolve_device
    from tools.preflight import device as measure
    from tools.preflight.report import Limits
    from tools.preflight.setup import backbone_arch, load_setup

    setup = load_setup(REPO / params, TINY_SETS if ctx.tiny else {}, outputs=ctx.work / "outputs")
    device = resolve_device(setup.model.device)
    who = measure.subject(setup, device, False, backbone_arch(setup.model))  # no hub: random weights, or tiny
    limits = Limits(steps=steps, probe_timeout_s=max(5.0, ctx.left() - 10))
    spec = measure.probe_spec(setup, who, GPUS, limits, None, ["memory", "speed", "inference"], device)
    spec = dataclasses.replace(spec, search=False)
    [(result, why)] = measure.run_probes([(spec, 0 if device.type == "cuda" else None)], limits.probe_timeout_s)
    if result is None:
        raise RuntimeError(f"the probe gave no result: {why}")
    figures = probe_figures(result, spec, who)
    if result.error:
        raise PartFailed(f"the probe stopped: {result.error.splitlines()[0]}", figures)
    if not result.memory.get("fits", False):
        raise PartFailed(f"the largest batch does not fit: {measure.fits((result, why))[1]}", figures)
    return "ok", figures


def probe_figures(result, spec, who) -> dict[str, Any]:
    """The probe's measurements, the plan's figures for the same recipe, and the run's projection from each."""
    from c2llm_lib.config import ModelConfig, TrainConfig, from_dict
    from tools.scale import GB, H100_BF16_FLOPS, Arch, Recipe, plan, step_keywords, text_flops

    model, train = from_dict(ModelConfig, spec.model, "spec"), from_dict(TrainConfig, spec.train, "spec")
    arch = Arch(**result.arch)
    texts = spec.rows * (2 + spec.negatives)
    keywords = step_keywords(model, arch)
    recipe = Recipe(
        arch,
        lora_r=model.lora_r,
        negatives=spec.negatives,
        max_length=train.max_length,
        global_batch=spec.rows * GPUS,
        grad_cache_chunk=train.grad_cache_chunk,
    )
    planned = plan(recipe, gpus=GPUS, gradient_checkpointing=model.gradient_checkpointing, grad_cache=train.grad_cache)
    parts = text_flops(arch, train.max_length, model.gradient_checkpointing, train.grad_cache, **keywords)
    out: dict[str, Any] = {
        "measured_on": result.backbone,
        "device": result.device,
        "dtype": result.dtype,
        "texts_per_device": texts,
        "max_length": train.max_length,
        "negatives": spec.negatives,
        "gradient_checkpointing": model.gradient_checkpointing,
        "grad_cache": train.grad_cache,
        "plan": {
            "memory_gb": planned["total_chosen_gb"],
            "hours_8_gpus": planned["hours"],
            "mfu": 0.35,
            "flops_per_device_step": planned["flops_per_step"] / GPUS,
            "steps": planned["steps"],
        },
    }
    memory = result.memory
    if memory:
        out["memory"] = {
            "peak_gib": memory["peak_bytes"] / 2**30,
            "peak_gb": memory["peak_bytes"] / GB,
            "fits": memory.get("fits"),
            "budget_gib": (memory.get("budget_bytes") or 0) / 2**30,
        }
    speed, gemm = result.speed, result.gemm_gflops
    if speed:
        achieved = speed["flops_per_step"] / speed["seconds_per_step"]  # FLOP/s of this device, by the rule
        model_share = (parts["forward"] + parts["backward"]) / parts["total"]  # without the recomputation
        out["speed"] = {
            "tokens_per_second": speed["tokens_per_second"],
            "seconds_per_step": speed["seconds_per_step"],
            "steps_timed": speed["steps"],
            "first_step_only": speed["first_step_only"],
            "flops_per_step": speed["flops_per_step"],
            "gemm_tflops": gemm.get("peak", 0) / 1e3,
            "mfu_vs_measured_gemm": speed.get("mfu"),
            "mfu_vs_datasheet": achieved / H100_BF16_FLOPS,
            "model_mfu_vs_datasheet": achieved * model_share / H100_BF16_FLOPS,
            "hours_8_gpus": planned["steps"] * speed["seconds_per_step"] / 3600,  # all-gather, all-reduce not counted
        }
    if result.inference:  # the form notebook 04 encodes (the merged adapter's rank, 0: none), and the bare backbone's
        kept = ("texts", "tokens", "tokens_per_second", "adapter_rank")  # adapter_rank: None from an older probe
        out["inference"] = {k: result.inference.get(k) for k in kept}
        if "untrained" in result.inference:
            out["inference"]["untrained_tokens_per_second"] = result.inference["untrained"]["tokens_per_second"]
    return out


def preflight_05b(ctx: Context) -> tuple[str, dict[str, Any]]:
    return preflight(ctx, "params/c2llm-0.5b.yaml", None)  # the memory step, then 2 timed steps on a GPU


def preflight_7b(ctx: Context) -> tuple[str, dict[str, Any]]:
    # one step of about 45 s: the memory step is the timed one (its first-call overheads are a small share of it)
    return preflight(ctx, "params/c2llm-7b.yaml", None if ctx.tiny else 0)


# encoding ------------------------------------------------------------------------------------------------------------
def encode(ctx: Context) -> tuple[str, dict[str, Any]]:
    """encode_bench on random weights of the 0.5B, every text at 2,048 tokens: PMA against last-token pooling."""
    spec = importlib.util.spec_from_file_location("encode_bench", REPO / "benchmarks" / "encode_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if ctx.tiny:
        args = [
            "--backbone",
            "tiny",
            "--max-length",
            "64",
            "--text-tokens",
            "64",
            "--texts",
            "8",
            "--batch-size",
            "4",
            "--repeats",
            "1",
        ]
    else:
        args = [
            "--backbone",
            "random-0.5b",
            "--max-length",
            "2048",
            "--text-tokens",
            "2048",
            "--texts",
            "64",
            "--batch-size",
            "16",
            "--repeats",
            "3",
        ]
    found = bench.main([*args, "--dtype", "bfloat16", "--out", str(ctx.work / "encode")])
    keys = (
        "backbone",
        "gpu",
        "dtype",
        "max_length",
        "batch_size",
        "texts",
        "real_tokens",
        "encode_tokens_per_s_sorted",
        "forward_s_pma",
        "forward_s_last_token",
        "pma_overhead_end_to_end",
        "pma_overhead_isolated",
        "lm_head_slowdown",
    )
    return "ok", {k: found[k] for k in keys}


# profile -----------------------------------------------------------------------------------------------------------
KINDS = (
    (
        "matrix products",
        ("gemm", "cutlass", "cublas", "xmma", "sm90", "sm80", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    ),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
)


def kind_of(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, marks in KINDS if any(m in lowered for m in marks)), "other")


def profile(ctx: Context) -> tuple[str, dict[str, Any]]:
    """One training step of the 0.5B recipe (8 rows of K = 7 at 1024 tokens on a GPU) under torch.profiler, after one
    warm-up step: the top kernels by self time (self CPU time of the aten ops on a CPU) in `profile.md`, and the
    step's time split by kind and the share with no kernel running (launches, Python, the CPU)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from c2llm_lib.hardware import resolve_device
    from tools.preflight import device as measure
    from tools.preflight.probe import build_encoder, largest_batch, trainer_for
    from tools.preflight.setup import backbone_arch, load_setup

    setup = load_setup(REPO / "params/c2llm-0.5b.yaml", TINY_SETS if ctx.tiny else {}, outputs=ctx.work / "outputs")
    device = resolve_device(setup.model.device)
    who = measure.subject(setup, device, False, backbone_arch(setup.model))
    encoder = build_encoder(who.model, who.arch)
    negatives = who.train.num_negatives
    step = trainer_for(encoder, who.train, negatives)
    rows = 2 if ctx.tiny else 8
    batch = largest_batch(encoder.tokenizer, rows, negatives, who.train.max_length, 0)
    on_gpu = encoder.device.type == "cuda"
    step.take_step(batch)  # warm-up: kernels chosen, memory allocated
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    tick = time.perf_counter()
    with torch_profile(activities=activities) as prof:
        step.take_step(batch)
        if on_gpu:
            torch.cuda.synchronize()
    wall = time.perf_counter() - tick
    rows_found = kernel_times(prof, on_gpu)
    busy = sum(t for _, _, t in rows_found)
    kinds: dict[str, float] = {}
    for name, _, seconds in rows_found:
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + seconds
    top = sorted(rows_found, key=lambda r: -r[2])[:15]
    figures = {
        "measured_on": "random weights of the 0.5B" if who.arch else "the tiny model",
        "rows": rows,
        "texts": rows * (2 + negatives),
        "max_length": who.train.max_length,
        "wall_s": wall,
        "kernel_s": busy,
        "no_kernel_share": max(0.0, 1 - busy / wall) if on_gpu else None,
        "by_kind": {k: v / max(busy, 1e-12) for k, v in sorted(kinds.items())},
        "top": [{"name": n, "calls": c, "seconds": s} for n, c, s in top],
    }
    (ctx.out / "profile.md").write_text(profile_table(figures, on_gpu))
    return "ok", figures


def kernel_times(prof, on_gpu: bool) -> list[tuple[str, int, float]]:
    """(name, calls, self seconds) of every GPU kernel (on a CPU: every aten op, by self CPU time)."""
    from torch.autograd import DeviceType

    out = []
    for event in prof.key_averages():
        if on_gpu:
            if getattr(event, "device_type", None) != DeviceType.CUDA:
                continue
            micros = getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)
        else:
            if not event.key.startswith("aten::"):
                continue
            micros = event.self_cpu_time_total
        if micros:
            out.append((event.key, event.count, micros / 1e6))
    if on_gpu and not out:  # no kernel-level entries in this torch: the ops' own device time
        for event in prof.key_averages():
            micros = getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)
            if micros:
                out.append((event.key, event.count, micros / 1e6))
    return out


def profile_table(figures: dict[str, Any], on_gpu: bool) -> str:
    basis = "self CUDA time of each kernel" if on_gpu else "self CPU time of each aten op (a CPU rehearsal)"
    lines = [
        f"# One training step under torch.profiler: {figures['measured_on']}",
        "",
        f"{figures['rows']} rows x (2 + K) = {figures['texts']} texts of {figures['max_length']} tokens; wall "
        f"{figures['wall_s']:.3f} s, kernels {figures['kernel_s']:.3f} s ({basis}).",
    ]
    if figures["no_kernel_share"] is not None:
        lines.append(f"No kernel ran during {figures['no_kernel_share']:.0%} of the step (launches, Python, CPU work).")
    shares = ", ".join(f"{k} {v:.0%}" for k, v in figures["by_kind"].items())
    lines += [f"Kernel time by kind: {shares}.", "", "| kernel | calls | seconds | share |", "|---|---|---|---|"]
    for row in figures["top"]:
        name = row["name"].replace("|", "/")[:90]
        lines.append(
            f"| `{name}` | {row['calls']} | {row['seconds']:.4f} | {row['seconds'] / figures['kernel_s']:.1%} |"
        )
    return "\n".join(lines) + "\n"


# smoke ---------------------------------------------------------------------------------------------------------------
def smoke(ctx: Context) -> tuple[str, dict[str, Any]]:
    """Notebooks 01-05 of params/smoke.yaml through the runner (papermill), on CUDA in bf16 (a CPU rehearsal: 01-02
    as the file sets them, the suite's own tests run the rest there)."""
    on_gpu = cuda()
    notebooks = ctx.notebooks or (["01", "02"] if ctx.tiny else ["01", "02", "03", "04", "05"])
    outputs = ctx.work / "smoke-outputs"
    cmd = [
        sys.executable,
        "-m",
        "c2llm_lib.pipeline",
        "params/smoke.yaml",
        "--only",
        *notebooks,
        "--outputs",
        str(outputs),
    ] + (["--set", "device=cuda", "dtype=bfloat16"] if on_gpu else [])
    done = subprocess.run(cmd, cwd=REPO, timeout=max(10.0, ctx.left() - 5))
    manifest_file = outputs / "smoke" / "manifest.json"
    manifest = json.loads(manifest_file.read_text()) if manifest_file.is_file() else {}
    records = manifest.get("notebooks", {})
    figures = {
        "notebooks": {
            name: {k: r.get(k) for k in ("status", "seconds", "peak_rss_kib")} for name, r in records.items()
        },
        "device": "cuda, bfloat16" if on_gpu else "cpu, float32 (the file's)",
        "manifest_device": manifest.get("device"),
        "html_copies": len(list((outputs / "smoke" / "notebooks").glob("*.html"))),  # nbconvert's templates found
    }
    if done.returncode != 0:
        raise PartFailed(manifest.get("error") or f"the runner exited with {done.returncode} (see the log)", figures)
    return "ok", figures


# running one part ----------------------------------------------------------------------------------------------------
class PartFailed(RuntimeError):
    """A part's failure that keeps the figures measured before it."""

    def __init__(self, message: str, figures: dict[str, Any]):
        super().__init__(message)
        self.figures = figures


FUNCTIONS = {
    "environment": environment,
    "gpu_tests": gpu_tests,
    "preflight_05b": preflight_05b,
    "encode": encode,
    "profile": profile,
    "preflight_7b": preflight_7b,
    "smoke": smoke,
}


def injected(name: str) -> None:
    """The failures the tests plant: C2LLM_GPU_CHECK_FAIL raises, C2LLM_GPU_CHECK_HANG hangs."""
    if name in os.environ.get("C2LLM_GPU_CHECK_FAIL", "").split(","):
        raise RuntimeError(f"a failure planted in {name} (C2LLM_GPU_CHECK_FAIL)")
    if name in os.environ.get("C2LLM_GPU_CHECK_HANG", "").split(","):
        print(f"{name}: hanging on purpose (C2LLM_GPU_CHECK_HANG)", flush=True)
        time.sleep(10**6)


def run_one(
    name: str, size: str, out: Path, work: Path, result: Path, seconds: float, notebooks: list[str] | None = None
) -> int:
    """One part in this process: its status and figures written to `result` as JSON; 1 when it failed."""
    ctx = Context(size, out, work, seconds, time.monotonic(), notebooks)
    status, figures, error = "failed", {}, ""
    try:
        injected(name)
        status, figures = FUNCTIONS[name](ctx)
    except Exception as err:
        figures = getattr(err, "figures", {})
        error = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    tmp = result.with_suffix(".tmp")
    tmp.write_text(json.dumps({"status": status, "figures": figures, "error": error}, default=str))
    os.replace(tmp, result)
    return 0 if status != "failed" else 1
