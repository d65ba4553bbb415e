"""The paper's scale on 8 x H100, computed (nothing here is measured): memory per GPU, steps, and wall time.

For the 0.5B and 7B recipes (params/c2llm-0.5b.yaml, params/c2llm-7b.yaml: LoRA r = 64 on all seven projections,
K = 7 hard negatives, length 1024, global batch 256, 3 epochs) and the paper's ~3M training pairs (section 4.1):
parameter counts from the Qwen2.5-Coder architectures (tested against the published totals and a model built on
the meta device), memory per GPU for the weights, LoRA + PMA with AdamW, activations at length 1024 with and
without gradient checkpointing and per GradCache chunk, steps per epoch, and the wall time from the FLOP count at
an assumed MFU. Every figure is an estimate from the formulas below; no GPU was available to measure one.

    python benchmarks/paper_scale_plan.py [--mfu 0.35] [--mean-tokens 1024]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

GB = 1e9
H100_BF16_FLOPS = 989e12  # dense bf16 tensor-core peak of an H100 SXM (no sparsity)
H100_MEMORY_GB = 80.0


@dataclass(frozen=True)
class Arch:
    """A Qwen2 decoder (the Qwen2.5-Coder configs on the hub)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool  # the LM head shares the embedding (0.5B); the encoder never uses the LM head

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


QWEN25_CODER_05B = Arch("Qwen2.5-Coder-0.5B", 896, 24, 14, 2, 4864, 151936, True)
QWEN25_CODER_7B = Arch("Qwen2.5-Coder-7B", 3584, 28, 28, 4, 18944, 152064, False)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def layer_shapes(a: Arch) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of one layer."""
    kv = a.kv_heads * a.head_dim
    h, i = a.hidden, a.intermediate
    return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h), "gate_proj": (h, i),
            "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip


def backbone_params(a: Arch, lm_head: bool = False) -> int:
    """Parameters of the decoder (q, k, v carry biases; two RMSNorms per layer and a final one), with the LM head
    when asked and untied."""
    per_layer = sum(i * o for i, o in layer_shapes(a).values()) + a.hidden + 2 * a.kv_heads * a.head_dim + 2 * a.hidden
    total = a.layers * per_layer + a.vocab * a.hidden + a.hidden
    return total + (a.vocab * a.hidden if lm_head and not a.tied else 0)


def matmul_params(a: Arch) -> int:
    """The decoder's matrix weights, the ones every token multiplies (no embedding, no norms, no biases)."""
    return a.layers * sum(i * o for i, o in layer_shapes(a).values())


def lora_params(a: Arch, r: int = 64) -> int:
    """LoRA A (r x in) and B (out x r) on every projection of every layer."""
    return a.layers * sum(r * (i + o) for i, o in layer_shapes(a).values())


def pma_params(d: int) -> int:
    """The PMA head at width d = hidden: seed S (d), fc_q/k/v/o with biases, two LayerNorms."""
    return d + 4 * (d * d + d) + 2 * 2 * d


def activation_bytes_per_token_layer(a: Arch, r: int = 64) -> int:
    """bf16 bytes one token keeps for the backward pass in one layer, with flash attention (no T x T scores) and
    no dropout: the two norms' inputs and outputs, q/k/v, the attention output, gate, up, SiLU(gate), their
    product, and LoRA's r-wide intermediates. An estimate (kernels may keep a little more)."""
    kv = a.kv_heads * a.head_dim
    elements = 4 * a.hidden + (a.hidden + 2 * kv) + a.hidden + 4 * a.intermediate + len(PROJECTIONS) * r
    return 2 * elements


@dataclass(frozen=True)
class Recipe:
    arch: Arch
    lora_r: int = 64
    negatives: int = 7  # K
    max_length: int = 1024
    global_batch: int = 256  # ours (the paper does not state it); params/c2llm-*.yaml
    epochs: int = 3
    pairs: int = 3_000_000  # "three million publicly available data" (section 1, 4.1)
    grad_cache_chunk: int = 16  # texts of max_length per GradCache micro-batch


def plan(recipe: Recipe, gpus: int = 8, mfu: float = 0.35, mean_tokens: float | None = None,
         gradient_checkpointing: bool = True, grad_cache: bool = False) -> dict[str, float]:  # fmt: skip
    """Every figure for one recipe on `gpus` H100s; `mean_tokens`: the mean real length of a text (default: every
    text at max_length, an upper bound). Memory in GB (1e9 bytes) per GPU."""
    a, r = recipe.arch, recipe.lora_r
    mean = recipe.max_length if mean_tokens is None else mean_tokens
    texts_per_gpu = recipe.global_batch * (2 + recipe.negatives) / gpus  # query, positive, K negatives per row
    tokens_per_gpu = texts_per_gpu * recipe.max_length  # the worst case the memory must hold
    trainable = lora_params(a, r) + pma_params(a.hidden)
    act_layer = activation_bytes_per_token_layer(a, r)
    boundary = 2 * a.hidden  # bf16 hidden state kept per token per layer under gradient checkpointing
    chunk_tokens = recipe.grad_cache_chunk * recipe.max_length

    def activations(tokens: float, checkpointing: bool) -> float:
        if checkpointing:  # layer inputs kept, one layer's activations rebuilt at a time
            return tokens * (a.layers * boundary + act_layer) / GB
        return tokens * a.layers * act_layer / GB

    out = {
        "backbone_params": backbone_params(a),
        "lora_params": lora_params(a, r),
        "pma_params": pma_params(a.hidden),
        "weights_gb": 2 * backbone_params(a) / GB,  # bf16, frozen
        "trainable_gb": 16 * trainable / GB,  # fp32 weights, gradients, AdamW's two moments
        "ddp_buckets_gb": 4 * trainable / GB,  # DDP's gradient buckets (fp32)
        "activations_full_batch_gb": activations(tokens_per_gpu, False),
        "activations_full_batch_checkpointed_gb": activations(tokens_per_gpu, True),
        "activations_chunk_gb": activations(chunk_tokens, False),
        "activations_chunk_checkpointed_gb": activations(chunk_tokens, True),
        "texts_per_gpu_per_step": texts_per_gpu,
    }
    chosen = activations(chunk_tokens if grad_cache else tokens_per_gpu, gradient_checkpointing)
    out["total_chosen_gb"] = out["weights_gb"] + out["trainable_gb"] + out["ddp_buckets_gb"] + chosen
    out["steps_per_epoch"] = recipe.pairs // recipe.global_batch  # at most: short group remainders are dropped
    out["steps"] = out["steps_per_epoch"] * recipe.epochs
    # FLOPs: a forward is 2 x matmul params per token plus causal attention (QK^T and AV over half the context);
    # a frozen backbone's backward computes input gradients only (one forward's worth); checkpointing adds a
    # forward, GradCache another (its graph-free first pass). LoRA's own FLOPs are ~1% and left out.
    forward_per_token = 2 * matmul_params(a) + 2 * 2 * a.layers * a.hidden * mean / 2
    passes = 2 + int(gradient_checkpointing) + int(grad_cache)
    tokens_per_step = recipe.global_batch * (2 + recipe.negatives) * mean
    out["flops_per_step"] = passes * forward_per_token * tokens_per_step
    out["flops_total"] = out["flops_per_step"] * out["steps"]
    out["hours"] = out["flops_total"] / (gpus * H100_BF16_FLOPS * mfu) / 3600
    out["forward_passes"] = passes
    return out


def report(mfu: float = 0.35, mean_tokens: float | None = None) -> str:
    """The README's table: both recipes on 8 x H100."""
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
    row("forward passes' worth of compute per step", "forward_passes", "d")
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
