"""The machine a run needs (paper section 4.1 trains in bf16 with flash attention on GPUs): CUDA and its devices,
bf16, the attention kernel the run will get, the collective backend for several processes, and the installed
libraries against the versions `pyproject.toml` asks for.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import torch

from c2llm_lib.checks import ConfigError

from ..scale import Arch, forward_flops_per_token
from .report import Check, gib
from .setup import Setup

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
FLASH_SPEEDUP = (1.5, 2.0)  # flash-attention 2's attention over PyTorch's (Dao 2023): the slowdown without it


def device_and_dtype(setup: Setup) -> tuple[Check, torch.device | None, torch.dtype | None]:
    """The device and dtype the run resolves (`device`, `dtype: auto` probed as the run probes), as a check."""
    from c2llm_lib.hardware import resolve_device, resolve_dtype

    try:
        device = resolve_device(setup.model.device)
    except RuntimeError as err:
        return Check("environment", "device", "fail", "no CUDA", f"{err}; set device: auto or cpu"), None, None
    dtype = resolve_dtype(setup.model.dtype, device)
    name = str(dtype).removeprefix("torch.")
    if device.type == "cuda":
        count = torch.cuda.device_count()
        props = [torch.cuda.get_device_properties(i) for i in range(count)]
        figure = f"{count} x {props[0].name} ({gib(props[0].total_memory)}), CUDA {torch.version.cuda}; {name}"
        values = {"gpus": [{"name": p.name, "memory_bytes": p.total_memory, "capability": f"{p.major}.{p.minor}"}
                           for p in props], "cuda": torch.version.cuda}  # fmt: skip
        return Check("environment", "device", "pass", figure, values=values), device, dtype
    from c2llm_lib.hardware import cpu_info

    info = cpu_info()
    figure = f"CPU {info['model']} ({', '.join(info['capabilities']) or 'no vector flags'}), {info['threads']} threads"
    figure += f", no CUDA; {name}" + (f" ({setup.model.dtype})" if setup.model.dtype == "auto" else "")
    return Check("environment", "device", "pass", figure, values={"cpu": info}), device, dtype


def check_bf16(setup: Setup, device: torch.device, dtype: torch.dtype) -> Check:
    """bf16 where the run computes in it: supported by the GPU, or on a CPU not slower than fp32 (emulated)."""
    name = str(dtype).removeprefix("torch.")
    if device.type == "cuda":
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            return Check("environment", "bf16", "fail", f"{torch.cuda.get_device_name(0)}: no bf16",
                         "this GPU has no bf16: set dtype: float16 or float32")  # fmt: skip
        if dtype == torch.float32:
            return Check("environment", "bf16", "warn", "float32 on a GPU",
                         "float32 runs at a fraction of the tensor cores' bf16 rate: set dtype: bfloat16 (the paper's) "
                         "unless float32 is meant")  # fmt: skip
        return Check("environment", "bf16", "pass", f"{name} supported by {torch.cuda.get_device_name(0)}")
    if dtype != torch.bfloat16:
        return Check("environment", "bf16", "pass", f"{name}: bf16 not used")
    from c2llm_lib.hardware import cpu_gemm_figures

    figures = cpu_gemm_figures()  # the probe `dtype: auto` uses, cached per machine
    rates = f"bf16 GEMM {figures['bfloat16']:.0f} vs fp32 {figures['float32']:.0f} GFLOP/s"
    if figures["bfloat16"] < figures["float32"]:
        slower = figures["float32"] / figures["bfloat16"]
        return Check("environment", "bf16", "warn", rates, f"bf16 is emulated on this CPU ({slower:.1f}x slower than "
                     "fp32): set dtype: auto (or float32)", values=figures)  # fmt: skip
    return Check("environment", "bf16", "pass", rates, values=figures)


def attention_share(arch: Arch, length: int) -> float:
    """The share of a forward's FLOPs that causal attention takes at `length` tokens (`scale.py`'s formula)."""
    total = forward_flops_per_token(arch, length)
    return (total - forward_flops_per_token(arch, 0)) / total


def check_attention(setup: Setup, device: torch.device, dtype: torch.dtype, arch: Arch | None) -> Check:
    """The attention kernel the run gets for this device and dtype; without flash-attention 2 on a GPU in 16 bits, a
    warning with the slowdown to expect, from attention's share of the FLOPs at max_length."""
    from c2llm_lib.model.backbone import flash_attention_available, resolve_attn_implementation

    asked = setup.model.attn_implementation
    try:
        kernel = resolve_attn_implementation(asked, device, dtype)
    except RuntimeError as err:
        return Check("environment", "attention", "fail", f"{asked} unavailable",
                     f"{err}: install it (pip install -e '.[gpu]') or set attn_implementation: auto")  # fmt: skip
    half = dtype in (torch.bfloat16, torch.float16)
    if device.type != "cuda":
        return Check("environment", "attention", "pass", f"{kernel} (flash-attention needs CUDA)")
    version = _version("flash-attn") or _version("flash_attn")
    if kernel == "flash_attention_2":
        return Check("environment", "attention", "pass", f"flash_attention_2 (flash-attn {version})")
    if not half:
        return Check("environment", "attention", "pass", f"{kernel} (flash-attention runs in 16 bits only)")
    share = attention_share(arch, setup.train.max_length) if arch is not None else None
    if share is None:
        slowdown = "attention's share of the step is unknown for this backbone"
        values = {}
    else:
        low, high = (1 + share * (s - 1) for s in FLASH_SPEEDUP)
        slowdown = (f"attention is {share:.0%} of a forward's FLOPs at max_length {setup.train.max_length}; at "
                    f"{FLASH_SPEEDUP[0]}-{FLASH_SPEEDUP[1]}x slower attention the steps take {low:.2f}-{high:.2f}x "
                    "as long (padded slots computed too: more where texts differ in length)")  # fmt: skip
        values = {"attention_share": share, "slowdown": [low, high]}
    reason = "flash-attn is not installed" if not flash_attention_available() else f"attn_implementation: {asked}"
    return Check("environment", "attention", "warn", f"{kernel}, not flash_attention_2", f"{reason}: {slowdown}. "
                 "Install flash-attn (pip install -e '.[gpu]') and keep attn_implementation: auto",
                 values=values)  # fmt: skip


def check_collectives(setup: Setup) -> tuple[Check, int]:
    """The backend several processes need: NCCL on GPUs, gloo on a CPU; (check, processes on this machine)."""
    from c2llm_lib.train.launch import processes

    try:
        nproc = processes(setup.launch, setup.model)
    except ConfigError as err:
        return Check("environment", "collectives", "fail", f"nproc {setup.launch.nproc}", str(err)), 1
    world = nproc * setup.launch.nnodes
    if world == 1:
        return Check("environment", "collectives", "pass", "1 process: no collective backend needed"), 1
    dist = torch.distributed
    if torch.cuda.is_available() and setup.model.device in ("auto", "cuda"):
        if not dist.is_available() or not dist.is_nccl_available():
            return Check("environment", "collectives", "fail", f"{world} processes, no NCCL",
                         "this torch has no NCCL: install a CUDA build of torch, or set nproc: 1")  # fmt: skip
        version = ".".join(map(str, torch.cuda.nccl.version()))
        return Check("environment", "collectives", "pass", f"{world} processes over NCCL {version}"), nproc
    if not dist.is_available() or not dist.is_gloo_available():
        return Check("environment", "collectives", "fail", f"{world} processes, no gloo",
                     "this torch has no gloo backend: set nproc: 1"), nproc  # fmt: skip
    return Check("environment", "collectives", "pass", f"{world} processes over gloo (CPU)"), nproc


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """The dependency specifiers of pyproject.toml (the installed package's metadata when the file is absent)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the installed metadata below
        tomllib = None
    if pyproject.is_file() and tomllib is not None:
        try:
            project = tomllib.loads(pyproject.read_text())["project"]
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"{pyproject}: cannot read [project] dependencies ({type(err).__name__}: {err})") from None
        return list(project.get("dependencies", []))
    return [r for r in (metadata.requires("c2llm_lib") or []) if "extra ==" not in r]


def check_versions(pyproject: Path = PYPROJECT) -> Check:
    """Every dependency installed at a version its specifier allows; torch and transformers named in the figure."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        specs = requirements(pyproject)
    except ValueError as err:
        return Check("environment", "versions", "fail", "pyproject.toml unreadable", str(err))
    bad, found = [], {}
    for text in specs:
        try:
            req = Requirement(text)
        except InvalidRequirement as err:
            bad.append(f"{text!r} is not a requirement ({err})")
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        version = _version(req.name)
        found[req.name] = version
        if version is None:
            bad.append(f"{req.name} is not installed ({pyproject.name} asks {req.specifier or 'any'})")
        elif req.specifier and not req.specifier.contains(version, prereleases=True):
            bad.append(f"{req.name} {version} is installed, {pyproject.name} asks {req.specifier}")
    shown = ", ".join(f"{k} {found.get(k)}" for k in ("torch", "transformers", "peft", "mteb") if k in found)
    figure = f"{len(found)} pinned packages; {shown}"
    if bad:
        return Check("environment", "versions", "fail", figure, "; ".join(bad) + " (pip install -e . installs them)",
                     values={"installed": found, "problems": bad})  # fmt: skip
    return Check("environment", "versions", "pass", figure, values={"installed": found})


def environment_checks(setup: Setup, arch: Arch | None) -> tuple[list[Check], torch.device | None, int]:
    """The environment group: (checks, the device, processes on this machine)."""
    device_check, device, dtype = device_and_dtype(setup)
    checks = [device_check]
    if device is not None:
        checks += [check_bf16(setup, device, dtype), check_attention(setup, device, dtype, arch)]
    collectives, nproc = check_collectives(setup)
    checks += [collectives, check_versions()]
    return checks, device, nproc
