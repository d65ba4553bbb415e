"""Training throughput, padding, peak memory and model FLOPs utilisation (MFU) on CPU: the tiny random backbone, or
the real 0.5B one.

Real tokens/s counts the non-padding tokens of queries, positives and K BM25 negatives per row that are embedded
with a graph (the trainer's per-step `tokens`), over the timed steps (the first `--warmup` steps are not timed).
Every forward of the encoder is recorded (a forward pre-hook: its rows' real lengths, its width, whether it builds a
graph), which gives the padding efficiency (real tokens / computed token slots) and the FLOPs, counted per real
text of L tokens by the rule of `tools/scale.py` (`text_flops`: the frozen matmuls once in the backward, LoRA
and the PMA head twice, causal attention's two products twice; GradCache's graph-free first pass and gradient
checkpointing's recomputed decoder forward as recomputation).

MFU = model FLOPs (forward + backward, no recomputation) per second / this machine's GEMM throughput in the same
dtype, measured in the same run (`hardware.gemm_gflops`, before and after training; the higher is the peak);
"MFU with recomputation" counts the recomputed forward too. `--profile` runs torch.profiler on one more step and
splits its time into GEMMs of the frozen backbone, LoRA GEMMs, attention, other kernels (norms, activations,
copies), the optimizer, and what no kernel accounts for (Python, autograd, dispatch). Run it alone on the machine:
it measures time.

Usage: python benchmarks/train_bench.py [--backbone tiny|real] [--steps 30] [--negatives 7] [--grad-cache]
       [--grad-cache-chunk 16] [--gradient-checkpointing] [--dtype auto|float32|bfloat16]
       [--lora-compute float32|backbone] [--profile]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset

from c2llm_lib import C2LLMEncoder, ModelConfig
from c2llm_lib.data import mine_negatives
from c2llm_lib.data.offline import load_snapshot
from c2llm_lib.hardware import cpu_info, gemm_gflops, peak_memory, reset_peak_memory
from c2llm_lib.model import REAL_GGUF_BACKBONE, TINY_BACKBONE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tools/ is not installed
from c2llm_lib.train import TrainConfig, Trainer
from tools.scale import arch_of, matmul_params, step_keywords
from tools.scale import text_flops as scale_text_flops


def flop_counts(encoder: C2LLMEncoder) -> dict[str, Any]:
    """What the FLOP rule (`scale.text_flops`) needs of this encoder: its architecture, LoRA and head."""
    arch = arch_of(encoder.backbone_config, "backbone")
    return {"arch": arch, **step_keywords(encoder.config, arch), "frozen": matmul_params(arch),
            "lora": sum(p.numel() for n, p in encoder.base_model.named_parameters() if "lora_" in n)}  # fmt: skip


def text_flops(size: dict[str, Any], length: int) -> dict[str, float]:
    """Forward and backward FLOPs of one text of `length` real tokens, and the decoder's forward (what gradient
    checkpointing recomputes), by the rule of `scale.py`."""
    keys = ("lora_r", "lora_targets", "head_width", "full_finetune")
    found = scale_text_flops(size["arch"], length, True, **{k: size[k] for k in keys if k in size})
    return {"forward": found["forward"], "backward": found["backward"], "backbone_forward": found["recompute"]}


def training_rows(negatives: int) -> Dataset:
    rows = [r for r in load_snapshot() if r["split"] == "train" and r["language"] == "python"]
    rows = [r for r in rows if r["dataset"] == "CodeSearchNetRetrieval"][:512]
    mined = mine_negatives([r["query"] for r in rows], [r["positive"] for r in rows], k=negatives)
    keys = ("dataset", "language", "query", "positive", "instruction")
    return Dataset.from_list([{k: r[k] for k in keys} | {"negatives": n} for r, n in zip(rows, mined, strict=True)])


def profile_step(trainer: Trainer, lora_r: int) -> dict[str, float]:
    """Kernel seconds of one more optimizer step by part (torch.profiler's self times of the aten ops, each op
    counted once: under `Optimizer.step` it is the optimizer's), and the profiled step's wall time."""
    from torch.profiler import ProfilerActivity, profile

    trainer.total_steps += 1
    tick = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        trainer.train()
    wall = time.perf_counter() - tick
    parts: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if not event.name.startswith("aten::"):
            continue  # annotations (their ops are counted under their own names)
        seconds, ancestor = event.self_cpu_time_total / 1e6, event.cpu_parent
        while ancestor is not None and not ancestor.name.startswith("Optimizer."):
            ancestor = ancestor.cpu_parent
        shapes = [d for shape in (event.input_shapes or []) for d in (shape or [])]
        if ancestor is not None:
            parts["optimizer"] += seconds
        elif event.name in ("aten::mm", "aten::addmm", "aten::bmm"):
            parts["lora_gemm" if lora_r in shapes else "backbone_gemm"] += seconds
        elif "scaled_dot_product" in event.name or "flash_attention" in event.name:
            parts["attention"] += seconds
        else:
            parts["other_kernels"] += seconds
    return {"profiled_wall": wall, **dict(parts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the timing")
    parser.add_argument("--global-batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--grad-cache", action="store_true")
    parser.add_argument("--grad-cache-chunk", type=int, default=16)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--backbone", choices=["tiny", "real"], default="tiny")
    parser.add_argument("--negatives", type=int, default=7)
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="float32")
    parser.add_argument(
        "--lora-compute",
        choices=["float32", "backbone"],
        default="float32",
        help="LoRA matmuls in float32 (peft's default) or in the backbone's dtype (mixed precision)",
    )
    parser.add_argument("--profile", action="store_true", help="profile one more step (not timed)")
    parser.add_argument("--tag", default="", help="added to the result file's name")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    table = training_rows(args.negatives)
    torch.manual_seed(0)
    backbone = TINY_BACKBONE if args.backbone == "tiny" else REAL_GGUF_BACKBONE
    enc = C2LLMEncoder.from_config(ModelConfig(backbone=backbone, device="cpu", dtype=args.dtype, use_lora=True,
                                               gradient_checkpointing=args.gradient_checkpointing,
                                               lora_compute=args.lora_compute))  # fmt: skip
    dtype = next(enc.base_model.parameters()).dtype
    info = cpu_info()
    limit = f"; kernels limited by {info['isa_limit']}" if info["isa_limit"] else ""
    print(f"CPU {info['model']} ({', '.join(info['capabilities'])}{limit}), {info['threads']} threads; dtype {dtype}")
    gemm_before = gemm_gflops(dtype)
    cfg = TrainConfig(max_steps=args.steps, global_batch_size=args.global_batch_size, max_length=args.max_length,
                      grad_cache=args.grad_cache, grad_cache_chunk=args.grad_cache_chunk,
                      num_negatives=args.negatives, warmup_steps=1, checkpoint_steps=[])  # fmt: skip
    trainer = Trainer(enc, table, cfg)
    forwards: list[dict] = []

    def record(module, inputs, kwargs):
        mask = kwargs["attention_mask"]  # (m, t)
        forwards.append({"step": trainer.step, "lengths": mask.sum(-1).tolist(), "width": mask.shape[-1],
                         "graph": torch.is_grad_enabled()})  # fmt: skip

    enc.register_forward_pre_hook(record, with_kwargs=True)
    reset_peak_memory()
    result = trainer.train()
    memory = peak_memory()
    gemm_after = gemm_gflops(dtype)
    breakdown = profile_step(trainer, enc.config.lora_r) if args.profile else None

    timed = result.metrics[args.warmup : args.steps]
    first, last = args.warmup, args.steps  # trainer.step at the hook: steps first .. last - 1 are timed
    seen = [f for f in forwards if first <= f["step"] < last]
    size = flop_counts(enc)
    model_flops = recompute_flops = 0.0
    real = slots = 0
    for f in seen:
        for length in f["lengths"]:
            flops = text_flops(size, length)
            if f["graph"]:
                model_flops += flops["forward"] + flops["backward"]
                recompute_flops += flops["backbone_forward"] if args.gradient_checkpointing else 0.0
            else:  # GradCache's graph-free pass
                recompute_flops += flops["forward"]
        if f["graph"]:
            real += sum(f["lengths"])
            slots += len(f["lengths"]) * f["width"]
    seconds = sum(m["seconds"] for m in timed)
    tokens = sum(m["tokens"] for m in timed)
    assert tokens == real, (tokens, real)  # the trainer's count and the hook's agree
    peak = max(gemm_before, gemm_after) * 1e9
    per_token = text_flops(size, 1)
    out = {
        "backbone": backbone, "dtype": str(dtype).removeprefix("torch."), "cpu": info,
        "max_length": args.max_length, "global_batch_size": args.global_batch_size, "negatives": args.negatives,
        "grad_cache": args.grad_cache, "grad_cache_chunk": args.grad_cache_chunk,
        "gradient_checkpointing": args.gradient_checkpointing, "lora_compute": args.lora_compute,
        "steps_timed": len(timed), "seconds": seconds,
        "real_tokens": tokens, "tokens_per_s": tokens / seconds, "padding_efficiency": real / max(1, slots),
        "forwards_per_step": sum(1 for f in seen if f["graph"]) / len(timed),
        "gemm_gflops": {"before": gemm_before, "after": gemm_after},
        "model_flops_per_real_token": model_flops / max(1, tokens),
        "recompute_flops_per_real_token": recompute_flops / max(1, tokens),
        "mfu": model_flops / seconds / peak, "mfu_with_recomputation": (model_flops + recompute_flops) / seconds / peak,
        "params": {"frozen_linear": size["frozen"], "lora": size["lora"]},
        "flops_per_token_at_length_1": per_token["forward"] + per_token["backward"],
        **memory, "step_seconds": [m["seconds"] for m in result.metrics],
        "step_tokens": [m["tokens"] for m in result.metrics],  # the same batches in every run (seeded sampler)
    }  # fmt: skip
    if breakdown:  # what no kernel accounts for in a timed step: Python, autograd, dispatch, the trainer's own work
        kernels = sum(v for k, v in breakdown.items() if k != "profiled_wall")
        breakdown["python_autograd_dispatch"] = seconds / len(timed) - kernels
        out["profile_one_step"] = {"timed_step_seconds": seconds / len(timed), **breakdown}
    name = f"train-cpu-{args.backbone}-{out['dtype']}{'-gradcache' if args.grad_cache else ''}"
    name += f"{'-lora-bf16' if args.lora_compute == 'backbone' else ''}{args.tag}.json"
    path = Path(__file__).resolve().parent / "results" / name
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
