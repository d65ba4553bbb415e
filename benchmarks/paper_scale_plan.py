"""The paper's scale on 8 x H100, computed (nothing here is measured): memory per GPU, steps, and wall time.

For the 0.5B and 7B recipes (params/c2llm-0.5b.yaml, params/c2llm-7b.yaml: LoRA r = 64 on all seven projections,
K = 7 hard negatives, length 1024, global batch 256, 3 epochs) and the paper's ~3M training pairs (section 4.1):
parameter counts from the Qwen2.5-Coder architectures (tested against the published totals and a model built on
the meta device), memory per GPU for the weights, LoRA + PMA with AdamW, activations at length 1024 with and
without gradient checkpointing and per GradCache chunk, steps per epoch, and the wall time from the FLOP count at
an assumed MFU (the FLOP rule of `scale.py`: LoRA's matmuls, attention's backward twice, the recomputation). Every
figure is an estimate from the formulas of `tools/scale.py` (shared with the preflight, which measures the same
quantities on a machine: `python -m tools.preflight params/<run>.yaml`, and with `make gpu-check`);
no GPU was available to measure one.

    python benchmarks/paper_scale_plan.py [--mfu 0.35] [--mean-tokens 1024]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tools/ is not installed
from tools.scale import (  # noqa: F401 (re-exported: tests/test_paper_scale_plan.py reads them from here)
    GB,
    H100_BF16_FLOPS,
    H100_MEMORY_GB,
    PROJECTIONS,
    QWEN25_CODER_05B,
    QWEN25_CODER_7B,
    Arch,
    Recipe,
    activation_bytes_per_token_layer,
    backbone_params,
    layer_shapes,
    lora_params,
    matmul_params,
    plan,
    pma_params,
)


def report(mfu: float = 0.35, mean_tokens: float | None = None) -> str:
    """docs/paper-scale.md's table: both recipes on 8 x H100."""
    rows = [("0.5B", Recipe(QWEN25_CODER_05B), False), ("7B", Recipe(QWEN25_CODER_7B), True)]
    plans = [(name, plan(recipe, mfu=mfu, mean_tokens=mean_tokens, grad_cache=gc), gc) for name, recipe, gc in rows]
    length = "every text at 1024 tokens (an upper bound)" if mean_tokens is None else f"{mean_tokens:g} tokens/text"
    lines = [
        f"Computed, not measured: 8 x H100 80GB, bf16, flash attention, MFU {mfu:.0%} (an assumption), {length}.",
        "",
        "| figure | 0.5B | 7B |",
        "|---|---|---|",
    ]

    def row(label: str, key: str, fmt: str) -> None:
        lines.append(f"| {label} | " + " | ".join(format(p[key], fmt) for _, p, _ in plans) + " |")

    row("backbone parameters (no LM head)", "backbone_params", ",")
    row("LoRA parameters (r = 64, 7 projections)", "lora_params", ",")
    row("PMA head parameters", "pma_params", ",")
    row("frozen weights, bf16 (GB/GPU)", "weights_gb", ".1f")
    row("LoRA + PMA: fp32 weights, grads, AdamW m and v (GB/GPU)", "trainable_gb", ".2f")
    row("DDP gradient buckets (GB/GPU)", "ddp_buckets_gb", ".2f")
    row("texts per GPU per step (256 x (1 + 1 + 7) / 8)", "texts_per_gpu_per_step", ".0f")
    row("activations, whole step at 1024, no checkpointing (GB/GPU)", "activations_full_batch_gb", ",.0f")
    row("activations, whole step at 1024, checkpointing (GB/GPU)", "activations_full_batch_checkpointed_gb", ".1f")
    row("activations, one GradCache chunk (16 x 1024 tokens), no checkpointing (GB)", "activations_chunk_gb", ".1f")
    row("activations, one GradCache chunk, checkpointing (GB)", "activations_chunk_checkpointed_gb", ".1f")
    lines.append("| plan | checkpointing, no GradCache | checkpointing + GradCache (chunk 16) |")
    row("total for the plan (GB/GPU, of 80)", "total_chosen_gb", ".1f")
    row("optimizer steps per epoch (3M pairs / 256)", "steps_per_epoch", ",")
    row("optimizer steps, 3 epochs", "steps", ",")
    row("compute per step, in forwards (the FLOP rule of scale.py)", "compute_in_forwards", ".2f")
    row("training FLOPs, 3 epochs", "flops_total", ".2e")
    row("wall time on 8 x H100 (hours)", "hours", ".1f")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mfu", type=float, default=0.35, help="model FLOPs utilisation assumed (0-1)")
    parser.add_argument("--mean-tokens", type=float, default=None, help="mean real tokens per text (default 1024)")
    args = parser.parse_args()
    if not 0 < args.mfu <= 1 or (args.mean_tokens is not None and not 0 < args.mean_tokens <= 1024):
        raise SystemExit("--mfu must be in (0, 1] and --mean-tokens in (0, 1024]")
    print(report(args.mfu, args.mean_tokens))


if __name__ == "__main__":
    main()
