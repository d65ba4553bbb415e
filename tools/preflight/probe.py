"""The preflight's measurements on one device, at the recipe's real sizes (paper section 4.1 training, 4.2 inference).

`device.run_probes` runs this module in a child process, one per device, so that a peak is the recipe's own (not the
preflight's imports or another device's) and an out-of-memory kill ends the child, never the preflight:

    python -m tools.preflight.probe SPEC.json OUT.json

SPEC (`ProbeSpec`) holds the model and training configs as the run resolves them, the rows this process gets of a
global batch (global batch / processes), K, the memory budget, what to measure, and where to write a checkpoint.
OUT receives a `ProbeResult` as JSON. In order:

- memory: the largest batch the recipe can see, every text of `max_length` tokens (queries with their instruction,
  documents with their prefix; texts of random words, cut at `max_length`), each row with K negatives, through one
  `TrainStep.take_step` (forward, backward and AdamW update, in length-grouped micro-batches, with GradCache and
  gradient checkpointing as configured). The peak is CUDA's `max_memory_allocated`, or on a CPU the process's
  resident high-water mark (VmHWM, reset after the model is built: the figure includes the weights), against the
  budget. An out-of-memory error is a result (`fits` false), not a crash. When it does not fit, the checkpoint
  round trip below still runs, then `search_memory` measures, in the same process (what a trial freed is returned
  first), the settings that lower it until one fits, and nothing else is measured.
- GEMM: this device's matrix-product throughput, bf16 on a GPU (the run's dtype on a CPU), measured before the
  steps and after the inference (`hardware.gemm_gflops`); MFU is taken against the higher of the two.
- speed: more optimizer steps on the same batch, timed (`steps`); real tokens per second, the step's FLOPs by the
  plan's formula (`scale.step_flops`) and MFU.
- inference: timed no-grad forwards of `eval_batch_size` texts of `eval_max_length` tokens (at most 4 texts on a CPU,
  whose rate does not grow with the batch): two warm-ups, then at least 5 passes and 2 s (at most 50, or 3 after 30 s,
  `time_passes`); the rate is the median pass's, and the passes' quartiles are kept as its spread. It times the form
  notebook 04 encodes (`merge.evaluation_form`), not the training's: after 16-bit training the base with one adapter of
  rank `eval_adapter_rank` (merge_last x lora_r), after float32 training or without LoRA the bare backbone (the
  update folded in); with `eval_untrained`, also the untrained baselines' pass (the bare backbone, one warm-up), unless
  that is the form already timed. Compromises: the bare backbone runs through peft with its adapter disabled (and
  under the encoder's `lora_compute` autocast), and in the probe's dtype: where notebook 03's CPU resolves `auto` to
  float32 while a GPU trained in bf16, notebook 04 encodes a float32 dense merge that is timed here in bf16.
- checkpoint: `train.save_checkpoint` of the adapter, head and optimizer state into the given folder, read back with
  `read_checkpoint` and compared tensor by tensor, with its size and the seconds it took.

The backbone is the run's, or, where the preflight says its weights cannot be had, random weights of its
architecture (`arch`, on a GPU) or the tiny random model: the result names which.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import json
import os
import random
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from c2llm_lib.config import ModelConfig, TrainConfig, from_dict
from c2llm_lib.hardware import gemm_gflops, high_water_kib, peak_bytes, reset_peak_memory, resolve_device, resolve_dtype

from ..scale import Arch, arch_of, step_flops, step_keywords

MAX_TRIALS = 7  # settings the memory search may measure
ROOM = 0.9  # a suggested setting's peak stays within this share of the budget (the margin a pass keeps)
FIRST_STEP_S = 20.0  # on a CPU, a memory step longer than this is timed on its own (no further step)
WARM_UPS, MIN_PASSES, MAX_PASSES = (
    2,
    5,
    50,
)  # inference forwards: untimed first, then timed (`time_passes`): at least, at most
MIN_TIMED_S, MAX_TIMED_S = 2.0, 30.0  # seconds of them: at least (with MIN_PASSES), and enough once 3 passes are in
TRAINING = frozenset({"memory", "speed", "checkpoint"})  # the measurements that take the largest training batch
DATASET, LANGUAGE = "CodeSearchNetRetrieval", "python"  # a dataset every prompt style has prompts for


@dataclass
class ProbeSpec:
    """What one child measures; written by `device.probe_spec` as JSON."""

    model: dict[str, Any]  # ModelConfig as resolved (device included)
    train: dict[str, Any]  # TrainConfig as resolved
    rows: int  # rows of the global batch this process embeds (global batch / processes; 0: no training measured)
    negatives: int  # K
    budget_bytes: float | None  # the most the step may use, given (None: the device's free memory at the start)
    share: float = 1.0  # of the host's free memory, on a CPU where several processes share it
    measure: list[str] = field(default_factory=lambda: ["memory", "speed", "inference", "checkpoint"])
    steps: int | None = None  # timed optimizer steps after the memory step (0: the memory step's own time; None: 2
    # on a GPU, on a CPU 1 when the memory step took under FIRST_STEP_S, else 0)
    arch: dict[str, Any] | None = None  # random weights of this architecture instead of loading the backbone
    eval_batch_size: int = 16  # texts of the timed inference forward (at most 4 on a CPU: the rate is the same)
    eval_max_length: int = 512
    eval_adapter_rank: int | None = None  # the LoRA rank notebook 04's merged model has after 16-bit training
    # (merge_last x lora_r: `merge.merge_as_adapter`); None: no adapter (a release, no LoRA, a dense merge)
    eval_untrained: bool = False  # also time the untrained baselines' pass (the backbone without any adapter)
    checkpoint_dir: str | None = None  # a folder for the round trip (the preflight's scratch beside the run directory)
    search: bool = True  # when the largest batch does not fit, measure the settings that lower its memory
    seed: int = 0


@dataclass
class ProbeResult:
    backbone: str  # what was measured: the run's backbone, "random weights of <arch>", or the tiny model
    device: str
    dtype: str
    arch: dict[str, Any]
    trainable: int  # trainable parameters (LoRA + head)
    memory: dict[str, Any] = field(default_factory=dict)
    gemm_gflops: dict[str, Any] = field(default_factory=dict)  # this device's GEMM peak: before, after, dtype
    speed: dict[str, Any] = field(default_factory=dict)
    inference: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    error: str = ""  # what stopped the probe before its end (after the memory step, or while building the model)


# the model ---------------------------------------------------------------------------------------------------------
def build_encoder(model: ModelConfig, arch: Arch | None):
    """The run's encoder, or (with `arch`) one on random weights of that architecture, built as `from_config` builds
    it (checkpointing, then LoRA), with the shipped Qwen2.5 tokenizer."""
    from c2llm_lib.model import C2LLMEncoder
    from c2llm_lib.model.backbone import TINY_BACKBONE, load_tokenizer

    if arch is None:
        return C2LLMEncoder.from_config(model)
    from transformers import AutoModel, Qwen2Config

    from c2llm_lib.model.backbone import (
        add_lora,
        enable_gradient_checkpointing,
        resolve_attn_implementation,
    )

    device = resolve_device(model.device)
    dtype = resolve_dtype(model.dtype, device)
    attn = resolve_attn_implementation(model.attn_implementation, device, dtype)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it computes: a 7B model never passes through host memory
        backbone = AutoModel.from_config(Qwen2Config(**arch.transformers_config()), attn_implementation=attn,
                                         dtype=dtype)  # fmt: skip
    backbone.config.use_cache = False
    if model.gradient_checkpointing:
        enable_gradient_checkpointing(backbone)
    if model.use_lora:
        backbone = add_lora(backbone, model)
    tokenizer = load_tokenizer(dataclasses.replace(model, backbone=TINY_BACKBONE))
    return C2LLMEncoder(backbone, tokenizer, model)


def full_length_texts(tokenizer, count: int, length: int, seed: int) -> list[str]:
    """`count` distinct texts of random words, each at least `length` tokens long (the step cuts them)."""
    rng = random.Random(seed)
    words = ["def", "return", "value", "items", "index", "self", "parse", "list", "count", "open", "path", "data"]
    texts = []
    for i in range(count):
        text = f"{i} " + " ".join(f"{rng.choice(words)}{rng.randrange(1000)}" for _ in range(length))
        texts.append(text)
    shortest = min(len(ids) for ids in tokenizer(texts[:4], add_special_tokens=False)["input_ids"])
    if shortest < length:  # never: every word is at least one token
        raise RuntimeError(f"a synthetic text has {shortest} tokens, fewer than max_length {length}")
    return texts


def largest_batch(tokenizer, rows: int, negatives: int, length: int, seed: int) -> dict[str, list]:
    """One process's share of a global batch, every text of `length` tokens or more, K negatives per row."""
    texts = full_length_texts(tokenizer, rows * (2 + negatives), length, seed)
    from c2llm_lib.data.sources import TABLE_1

    return {
        "dataset": [DATASET] * rows, "language": [LANGUAGE] * rows, "instruction": [TABLE_1[DATASET]] * rows,
        "query": texts[:rows], "positive": texts[rows : 2 * rows],
        "negatives": [texts[2 * rows + i * negatives : 2 * rows + (i + 1) * negatives] for i in range(rows)],
    }  # fmt: skip


# peaks ---------------------------------------------------------------------------------------------------------------
def reset_peak(device: torch.device) -> int:
    """Starts a peak window (`hardware.reset_peak_memory`); returns the bytes in use now (CUDA: allocated; CPU:
    resident)."""
    reset_peak_memory()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device)
    return (high_water_kib() or 0) * 1024


def free_bytes(device: torch.device) -> int | None:
    """The device's free memory now: CUDA's free memory, or the host's MemAvailable (Linux); None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError)) or "out of memory" in str(err).lower()


# the measurements ----------------------------------------------------------------------------------------------------
def trainer_for(encoder, train: TrainConfig, negatives: int):
    """A `TrainStep` with a constant learning-rate schedule (the run's schedule needs the run's length)."""
    from c2llm_lib.train import TrainStep

    step = TrainStep(encoder, train)
    step.k = negatives
    step.scheduler = torch.optim.lr_scheduler.LambdaLR(step.optimizer, lambda _: 1.0)
    return step


def measure_memory(step, batch: dict[str, list], device: torch.device, budget: float | None) -> dict[str, Any]:
    """One optimizer step on the largest batch: its peak against the budget; out of memory is `fits: False`."""
    before = reset_peak(device)
    tick = time.perf_counter()
    try:
        logged = step.take_step(batch)
    except Exception as err:
        if not is_out_of_memory(err):
            raise
        peak = peak_bytes(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {"fits": False, "out_of_memory": True, "peak_bytes": peak, "before_bytes": before,
                "budget_bytes": budget, "error": f"{type(err).__name__}: {str(err)[:300]}"}  # fmt: skip
    peak = peak_bytes(device)
    seconds = time.perf_counter() - tick
    fits = budget is None or peak <= budget
    return {"fits": fits, "out_of_memory": False, "peak_bytes": peak, "before_bytes": before, "budget_bytes": budget,
            "seconds": seconds, "tokens": logged["tokens"], "forwards": logged["forwards"],
            "padding_efficiency": logged["padding_efficiency"], "loss": logged["loss"]}  # fmt: skip


def release(device: torch.device) -> None:
    """Returns what the last trial freed: to the CUDA driver, or (glibc) to the operating system, so that the next
    trial's peak starts from the same level a fresh process would."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the next peak may start a little higher
        pass


def candidates(checkpointing: bool, train: TrainConfig) -> list[dict[str, Any]]:
    """The settings that lower a step's memory, in the order they cost the least speed: gradient checkpointing, then
    GradCache at the run's chunk; halved chunks follow in `search_memory`."""
    out, settled = [], {}
    if not checkpointing:
        settled = {"gradient_checkpointing": True}
        out.append(dict(settled))
    if not train.grad_cache:
        out.append({**settled, "grad_cache": True, "grad_cache_chunk": train.grad_cache_chunk})
    return out


def search_memory(encoder, train: TrainConfig, batch: dict[str, list], negatives: int, budget: float | None,
                  max_trials: int = MAX_TRIALS) -> dict[str, Any]:  # fmt: skip
    """The first setting whose largest batch fits `budget` with room to spare (ROOM of it), measured in this process:
    gradient checkpointing, then GradCache at the run's chunk, then halved chunks, then bisection up to the largest
    chunk that fits. Returns {"suggestion": the overrides or None, "target_bytes", "trials": [{settings, fits,
    peak_bytes}]}."""
    from c2llm_lib.model.backbone import enable_gradient_checkpointing

    device = encoder.device
    target = None if budget is None else ROOM * budget
    trials: list[dict[str, Any]] = []

    def trial(overrides: dict[str, Any]) -> bool:
        if overrides.get("gradient_checkpointing"):
            enable_gradient_checkpointing(encoder.base_model)
        cfg = dataclasses.replace(train, **{k: v for k, v in overrides.items() if k != "gradient_checkpointing"})
        release(device)
        found = measure_memory(trainer_for(encoder, cfg, negatives), batch, device, target)
        trials.append({"settings": overrides, "fits": found["fits"], "peak_bytes": found["peak_bytes"],
                       "out_of_memory": found["out_of_memory"]})  # fmt: skip
        release(device)
        return found["fits"]

    settled: dict[str, Any] = {}
    for overrides in candidates(encoder.config.gradient_checkpointing, train):
        settled = overrides
        if trial(overrides):
            return {"suggestion": overrides, "target_bytes": target, "trials": trials}
    settled = {**settled, "grad_cache": True}
    failed, size = train.grad_cache_chunk, train.grad_cache_chunk // 2
    while size >= 1 and len(trials) < max_trials:
        if trial({**settled, "grad_cache_chunk": size}):
            break
        failed, size = size, size // 2
    else:
        return {"suggestion": None, "target_bytes": target, "trials": trials}
    low, high = size, failed  # fits at low, not at high: bisect while trials remain
    while high - low > 1 and len(trials) < max_trials:
        middle = (low + high) // 2
        if trial({**settled, "grad_cache_chunk": middle}):
            low = middle
        else:
            high = middle
    return {"suggestion": {**settled, "grad_cache_chunk": low}, "target_bytes": target, "trials": trials}


def gemm_peak(dtype: torch.dtype, device: torch.device) -> float:
    """This device's measured GEMM throughput in `dtype` (GFLOP/s): large matrices on a GPU, 1024 on a CPU."""
    size = 8192 if device.type == "cuda" else 1024
    return gemm_gflops(dtype, size=size, device=str(device))


def measure_speed(step, batch: dict[str, list], steps: int | None, arch: Arch, device: torch.device,
                  first: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """`steps` timed optimizer steps on `batch` (none: the memory step `first`, its first-call overheads included),
    tokens/s and the step's FLOPs by the plan's count (`scale.step_flops`)."""
    if steps is None:
        steps = 2 if device.type == "cuda" else int(first.get("seconds", 0.0) < FIRST_STEP_S)
    steps = steps if steps or "seconds" in first else 1
    seconds, tokens = ([first["seconds"]], [first["tokens"]]) if steps == 0 else ([], [])
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        tick = time.perf_counter()
        logged = step.take_step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - tick)
        tokens.append(logged["tokens"])
    texts = len(batch["query"]) * (2 + step.k)
    cfg, model = step.cfg, step.encoder.config
    flops = step_flops(arch, texts, cfg.max_length, model.gradient_checkpointing, cfg.grad_cache,
                       **step_keywords(model, arch))  # fmt: skip
    per_step = sum(seconds) / len(seconds)
    return {"steps": len(seconds), "first_step_only": steps == 0, "step_seconds": seconds,
            "seconds_per_step": per_step, "tokens_per_step": tokens[-1],
            "tokens_per_second": sum(tokens) / sum(seconds), "flops_per_step": flops}  # fmt: skip


def time_passes(run, synchronize, warm_ups: int = WARM_UPS) -> list[float]:
    """Seconds of each timed call of `run` (`synchronize` after each), after `warm_ups` untimed calls: at least
    MIN_PASSES calls and MIN_TIMED_S in all, at most MAX_PASSES calls, or 3 once MAX_TIMED_S have passed. One call of a
    small model lasts milliseconds, where a context switch or a frequency step weighs as much as the call itself."""
    for _ in range(warm_ups):
        run()
        synchronize()
    seconds: list[float] = []
    while True:
        tick = time.perf_counter()
        run()
        synchronize()
        seconds.append(time.perf_counter() - tick)
        count, total = len(seconds), sum(seconds)
        enough = (count >= MIN_PASSES and total >= MIN_TIMED_S) or (count >= 3 and total >= MAX_TIMED_S)
        if enough or count >= MAX_PASSES:
            return seconds


def measure_inference(encoder, batch_size: int, length: int, seed: int, warm_ups: int = WARM_UPS) -> dict[str, Any]:
    """Timed no-grad forwards of `batch_size` texts of `length` tokens (`time_passes`): the rate at the median pass,
    with the passes' quartiles (the spread the projection reports) and the fastest and slowest."""
    if encoder.device.type == "cpu":
        batch_size = min(batch_size, 4)  # a CPU's rate does not grow with the batch; a GPU's does
    texts = full_length_texts(encoder.tokenizer, batch_size, length, seed + 1)
    tokens = encoder.tokenize_formatted(encoder.format_texts(texts, "document"), length)  # (B, T)
    encoder.eval()
    device = encoder.device

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.no_grad():
        seconds = time_passes(lambda: encoder(**tokens), synchronize, warm_ups)
    encoder.train()
    real = int(tokens["attention_mask"].sum())
    first, median, third = statistics.quantiles(seconds, n=4, method="inclusive")
    return {"texts": batch_size, "tokens": real, "seconds": median, "passes": len(seconds), "pass_seconds": seconds,
            "quartiles": [first, third], "fastest": min(seconds), "slowest": max(seconds),
            "tokens_per_second": real / median}  # fmt: skip


def measure_evaluation(encoder, spec: ProbeSpec) -> dict[str, Any]:
    """`measure_inference` of the forms notebook 04 encodes (`merge.evaluation_form`, decided by
    `device.evaluated_rank`): the base and one adapter of `spec.eval_adapter_rank` (added beside the training's,
    timed, then deleted: the checkpoint round trip after sees the training's alone); without one the bare backbone.
    With `spec.eval_untrained` the untrained baselines' pass is timed too, as "untrained", where it differs from the
    form timed (the bare backbone). "adapter_rank" names the rank timed (0: none)."""
    from contextlib import nullcontext

    from peft import LoraConfig, PeftModel

    backbone = encoder.backbone
    peft = isinstance(backbone, PeftModel)
    rank = spec.eval_adapter_rank if peft else None

    def timed(warm_ups: int = WARM_UPS) -> dict[str, Any]:
        return measure_inference(encoder, spec.eval_batch_size, spec.eval_max_length, spec.seed, warm_ups)

    def bare():
        return backbone.disable_adapter() if peft else nullcontext()

    if rank is None:
        with bare():
            return {**timed(), "adapter_rank": 0}
    targets = sorted({name.rsplit(".", 1)[-1] for name in backbone.peft_config["default"].target_modules})
    backbone.add_adapter("evaluated", LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=targets,
                                                 bias="none"))  # fmt: skip
    try:
        backbone.set_adapter("evaluated")
        found = {**timed(), "adapter_rank": rank}
    finally:
        backbone.set_adapter("default")
        backbone.delete_adapter("evaluated")
    if spec.eval_untrained:
        with bare():
            found["untrained"] = {**timed(warm_ups=1), "adapter_rank": 0}  # the process is warm
    return found


def round_trip(step, folder: Path) -> dict[str, Any]:
    """A checkpoint of the adapter, head and optimizer state written and read back; every tensor compared."""
    from peft import get_peft_model_state_dict

    from c2llm_lib.train import optimizer_to_state, read_checkpoint, save_checkpoint

    encoder = step.encoder
    optimizer, tensors = optimizer_to_state(step.optimizer.state_dict())
    state = {"step": step.step, "training": {}, "optimizer": optimizer, "scheduler": {}, "sampler": {}, "rng": [],
             "metrics": [], "checkpoints": []}  # fmt: skip
    target = folder / "step-000000"
    tick = time.perf_counter()
    save_checkpoint(target, encoder, (state, tensors))
    written = time.perf_counter() - tick
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    back = read_checkpoint(target)
    expected = {
        "adapter": {k: v.detach().cpu() for k, v in get_peft_model_state_dict(encoder.backbone).items()},
        "head": {k: v.detach().cpu() for k, v in encoder.pooler.state_dict().items()},
        "optimizer": tensors,
    }
    found = {"adapter": back.adapter, "head": back.pooler, "optimizer": back.state_tensors}
    differ = []
    for part, tensors_here in expected.items():
        missing = sorted(set(tensors_here) ^ set(found[part]))
        differ += [f"{part}: {name} missing on one side" for name in missing[:3]]
        differ += [f"{part}: {name} differs" for name in sorted(set(tensors_here) & set(found[part]))
                   if not torch.equal(tensors_here[name], found[part][name])][:3]  # fmt: skip
    count = sum(len(v) for v in expected.values())
    return {"bytes": size, "seconds": written, "tensors": count, "equal": not differ, "differences": differ[:5]}


def budget_for(spec: ProbeSpec, free: int | None, resident: int) -> float | None:
    """The most the step may use: the device's free memory at the start (a CPU process: the host's available memory
    times its `share`, plus what it holds already), capped by the given budget."""
    if free is None:
        return spec.budget_bytes
    room = free + resident if resident else free
    room *= spec.share
    return room if spec.budget_bytes is None else min(room, spec.budget_bytes)


def probe(spec: ProbeSpec) -> ProbeResult:
    """Every measurement `spec.measure` names, in order; an error after the model is built is recorded, not raised."""
    model = from_dict(ModelConfig, spec.model, "probe spec")
    train = from_dict(TrainConfig, spec.train, "probe spec")
    arch = Arch(**spec.arch) if spec.arch else None
    device = resolve_device(model.device)
    free = free_bytes(device)  # before the weights
    resident = 0 if device.type == "cuda" else (high_water_kib() or 0) * 1024
    torch.manual_seed(spec.seed)
    encoder = build_encoder(model, arch)
    dtype = next(encoder.base_model.parameters()).dtype
    measured_arch = arch or arch_of(encoder.backbone_config, model.backbone)
    name = f"random weights of {arch.name}" if arch else model.backbone
    trainable = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    result = ProbeResult(name, str(encoder.device), str(dtype).removeprefix("torch."),
                         dataclasses.asdict(measured_arch), trainable)  # fmt: skip
    try:
        training = TRAINING & set(spec.measure)
        step = trainer_for(encoder, train, spec.negatives) if training else None
        batch = None  # an evaluation alone builds no training batch
        if training:
            batch = largest_batch(encoder.tokenizer, spec.rows, spec.negatives, train.max_length, spec.seed)
        if "memory" in spec.measure:
            budget = budget_for(spec, free, resident)
            result.memory = measure_memory(step, batch, encoder.device, budget)
            result.memory["free_bytes"] = free
            if not result.memory["fits"]:
                if "checkpoint" in spec.measure and spec.checkpoint_dir:  # what the steps below do not need
                    result.checkpoint = round_trip(step, Path(spec.checkpoint_dir))
                if spec.search:
                    del step
                    result.memory["search"] = search_memory(encoder, train, batch, spec.negatives, budget)
                return result  # the steps below would not fit either
        gemm_dtype = torch.bfloat16 if encoder.device.type == "cuda" else dtype
        result.gemm_gflops = {"before": gemm_peak(gemm_dtype, encoder.device),
                              "dtype": str(gemm_dtype).removeprefix("torch.")}  # fmt: skip
        if "speed" in spec.measure:
            result.speed = measure_speed(step, batch, spec.steps, measured_arch, encoder.device, result.memory)
        if "inference" in spec.measure:
            result.inference = measure_evaluation(encoder, spec)
        result.gemm_gflops["after"] = gemm_peak(gemm_dtype, encoder.device)
        result.gemm_gflops["peak"] = max(result.gemm_gflops["before"], result.gemm_gflops["after"])
        if result.speed:  # MFU against the higher of the two (the machine at its best during the steps)
            speed = result.speed
            speed["mfu"] = speed["flops_per_step"] / speed["seconds_per_step"] / (result.gemm_gflops["peak"] * 1e9)
        if "checkpoint" in spec.measure and spec.checkpoint_dir:
            result.checkpoint = round_trip(step, Path(spec.checkpoint_dir))
    except Exception as err:
        result.error = f"{type(err).__name__}: {err}\n{''.join(traceback.format_exc(limit=-3))}"
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m tools.preflight.probe SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = ProbeSpec(**json.loads(Path(args[0]).read_text()))
    result = probe(spec)
    out = Path(args[1])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(result), default=str) + "\n")
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
