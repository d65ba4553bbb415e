"""The recipe's size in numbers (paper section 4.1): parameter counts, memory per device, optimizer steps and FLOPs.

Formulas only, nothing measured: the computed plan of the paper's scale (`benchmarks/paper_scale_plan.py`, the
table in docs/paper-scale.md) and the preflight (`tools/preflight/`, which measures the same quantities on a machine:
its MFU and its projections use these FLOPs, its disk estimate these parameter counts) both use them. For a Qwen2
decoder (`Arch`, the Qwen2.5-Coder configs, or `arch_of` any transformers config):

- parameters: the backbone without LM head, LoRA's A and B on the seven projections, the PMA head at width d;
- memory: bf16 frozen weights, LoRA + PMA in fp32 with AdamW (weights, gradients, two moments: 16 bytes each), DDP's
  fp32 gradient buckets, and activations per token with flash attention (no T x T scores), with and without
  gradient checkpointing and per GradCache chunk;
- FLOPs (the rule behind the plan's hours and the preflight's MFU, stated once here and tested against torch's
  `FlopCounterMode` in tests/test_flops.py). For one text of T tokens, with M the decoder's matrix weights, A the LoRA
  A and B weights of every adapted projection (`lora_params`: 9.8 % of M for the 0.5B at r = 64, 2.5 % for the 7B),
  h the hidden width (query heads x head width), L layers, d the PMA head's width:

      forward     F  = 2 M T  +  2 A T  +  2 L h T (T + 1)  +  head
                       matmuls   LoRA      causal attention: the i-th token's query meets i keys (i = 1..T), and
                                           QK^T and AV each cost 2 h FLOPs per (query, key) pair
      head           = 4 h d T (fc_k, fc_v)  +  4 d T (one query's scores and weighted sum)  +  2 d^2 (fc_o)
      backward       = 2 M T (1 x: a frozen weight needs the input gradient only; 2 x when the backbone trains)
                       + 2 x LoRA (A and B need input and weight gradients)
                       + 2 x attention (QK^T: dQ and dK; AV: dP and dV; two products each)  +  2 x head
      checkpointing  + one forward of the decoder layers (matmuls, LoRA, attention; the head is not checkpointed)
      GradCache      + one whole forward F (its graph-free first pass)

  Not counted: element-wise work (norms, softmax, RoPE, SiLU, AdamW), the PMA's fc_q (2 d^2 once per micro-batch),
  the loss's similarity products (queries x documents x d per step, < 1e-6 of a step). The counter differs where a
  kernel does work the rule does not count as model FLOPs (tests/test_flops.py states each difference): it counts
  attention as the full T x T products (causal kernels skip the masked half, the rule counts the causal products),
  torch's checkpoint stops its recomputation early (each layer's last LoRA B product, 2 r h T per layer), and
  without checkpointing the first layer's q, k, v skip their input gradients (the frozen embedding needs none).
  The count before this rule left LoRA out (as "~1 %") and counted attention's backward once: it was 12.8 % short of
  the rule for the 0.5B recipe (3.7 % for the 7B's), and so were the plan's hours and the preflight's MFU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GB = 1e9
H100_BF16_FLOPS = 989e12  # dense bf16 tensor-core peak of an H100 SXM (no sparsity)
H100_MEMORY_GB = 80.0
PAPER_PAIRS = 3_000_000  # "three million publicly available data" (section 1, 4.1)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
Targets = tuple[str, ...] | list[str]  # the projections LoRA adapts


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

    def transformers_config(self) -> dict[str, Any]:
        """The keyword arguments of a `Qwen2Config` with this architecture (for a model of random weights)."""
        return {"vocab_size": self.vocab, "hidden_size": self.hidden, "intermediate_size": self.intermediate,
                "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "tie_word_embeddings": self.tied,
                "max_position_embeddings": 32768, "rms_norm_eps": 1e-6}  # fmt: skip


QWEN25_CODER_05B = Arch("Qwen2.5-Coder-0.5B", 896, 24, 14, 2, 4864, 151936, True)
QWEN25_CODER_7B = Arch("Qwen2.5-Coder-7B", 3584, 28, 28, 4, 18944, 152064, False)
KNOWN_ARCHS = (QWEN25_CODER_05B, QWEN25_CODER_7B)


def arch_of(config: Any, name: str = "") -> Arch:
    """The `Arch` of a transformers decoder config (Qwen2's attribute names); a size that is not a positive whole
    number is a ValueError naming it."""

    def size(key: str, default: Any = None) -> int:
        value = getattr(config, key, None) or default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"config {key} must be a positive whole number, got {value!r}")
        return value

    heads = size("num_attention_heads")
    return Arch(name or getattr(config, "name_or_path", "") or type(config).__name__, size("hidden_size"),
                size("num_hidden_layers"), heads, size("num_key_value_heads", heads), size("intermediate_size"),
                size("vocab_size"), bool(getattr(config, "tie_word_embeddings", False)))  # fmt: skip


def known_arch(backbone: str) -> Arch | None:
    """The Qwen2.5-Coder architecture a backbone name refers to (a hub id or the GGUF alias), else None."""
    lowered = backbone.lower()
    for arch in KNOWN_ARCHS:
        if arch.name.lower() in lowered:
            return arch
    return None


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


def lora_params(a: Arch, r: int = 64, targets: tuple[str, ...] | list[str] = PROJECTIONS) -> int:
    """LoRA A (r x in) and B (out x r) on every targeted projection of every layer."""
    return a.layers * sum(r * (i + o) for name, (i, o) in layer_shapes(a).items() if name in targets)


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


def attention_flops(a: Arch, tokens: float, causal: bool = True) -> float:
    """QK^T and AV of one text of `tokens` tokens in every layer: 2 h FLOPs each per (query, key) pair, over the
    T (T + 1) / 2 causal pairs (or all T^2 with `causal=False`, what a kernel that ignores the mask computes)."""
    pairs = tokens * (tokens + 1) / 2 if causal else tokens * tokens
    return 2 * 2 * a.layers * a.hidden * pairs


def head_flops(hidden: int, width: int, tokens: float) -> float:
    """The PMA head's forward for one text (module docstring): fc_k and fc_v on every token, one query's scores and
    weighted sum, fc_o once; 0 for width 0 (no head: last-token or mean pooling)."""
    if not width:
        return 0.0
    return 4 * hidden * width * tokens + 4 * width * tokens + 2 * width * width


def text_flops(a: Arch, tokens: float, gradient_checkpointing: bool = False, grad_cache: bool = False,
               lora_r: int = 64, lora_targets: Targets = PROJECTIONS, head_width: int | None = None,
               full_finetune: bool = False, causal: bool = True) -> dict[str, float]:  # fmt: skip
    """The rule (module docstring) for one text of `tokens` tokens, by part: `forward` (F), `backward`,
    `recompute` (checkpointing), `grad_cache` (GradCache's first pass), `total` (a training step's share) and the
    forward's own parts (`matmuls`, `lora`, `attention`, `head`). `head_width` None: a PMA head at the hidden width
    (the recipes'), 0: none. `lora_r` 0: no LoRA. `full_finetune`: the backbone's weights train too."""
    parts = {
        "matmuls": 2 * matmul_params(a) * tokens,
        "lora": 2 * lora_params(a, lora_r, lora_targets) * tokens if lora_r else 0.0,
        "attention": attention_flops(a, tokens, causal),
        "head": head_flops(a.hidden, a.hidden if head_width is None else head_width, tokens),
    }
    decoder = parts["matmuls"] + parts["lora"] + parts["attention"]
    forward = decoder + parts["head"]
    base = 2 if full_finetune else 1  # a frozen weight: the input gradient only
    backward = base * parts["matmuls"] + 2 * (parts["lora"] + parts["attention"] + parts["head"])
    recompute = decoder if gradient_checkpointing else 0.0
    first_pass = forward if grad_cache else 0.0
    total = forward + backward + recompute + first_pass
    return {**parts, "forward": forward, "backward": backward, "recompute": recompute, "grad_cache": first_pass,
            "total": total}  # fmt: skip


def forward_flops_per_token(a: Arch, mean_tokens: float, lora_r: int = 0, lora_targets: Targets = PROJECTIONS,
                            head_width: int = 0) -> float:  # fmt: skip
    """One forward's FLOPs per token of a text of `mean_tokens` tokens, by the rule (inference: a dense merge has no
    LoRA, a merge kept as an adapter after 16-bit training has its stacked rank; the head only when asked). At 0
    tokens: what every token costs whatever the length (no attention)."""
    if mean_tokens > 0:
        found = text_flops(a, mean_tokens, lora_r=lora_r, lora_targets=lora_targets, head_width=head_width)
        return found["forward"] / mean_tokens
    lora = 2 * lora_params(a, lora_r, lora_targets) if lora_r else 0
    return 2 * matmul_params(a) + lora + 4 * (a.hidden + 1) * head_width


def step_flops(a: Arch, texts: float, mean_tokens: float, gradient_checkpointing: bool, grad_cache: bool,
               lora_r: int = 64, lora_targets: Targets = PROJECTIONS, head_width: int | None = None,
               full_finetune: bool = False) -> float:  # fmt: skip
    """FLOPs of one optimizer step that embeds `texts` texts of `mean_tokens` tokens (on one device or all), by the
    rule (module docstring); the defaults are the paper's recipe (LoRA r = 64 on the seven projections, PMA at the
    hidden width, frozen backbone)."""
    found = text_flops(a, mean_tokens, gradient_checkpointing, grad_cache, lora_r, lora_targets, head_width,
                       full_finetune)  # fmt: skip
    return texts * found["total"]


def step_keywords(model: Any, a: Arch) -> dict[str, Any]:
    """`step_flops`' keywords for a `ModelConfig` (duck-typed: this module imports nothing of the library): its LoRA
    rank and targets, or a backbone that trains whole; its PMA head's width (0 for the other poolers)."""
    width = (model.embedding_dim or a.hidden) if model.pooling == "pma" else 0
    if not model.use_lora:
        return {"lora_r": 0, "head_width": width, "full_finetune": True}
    return {"lora_r": model.lora_r, "lora_targets": tuple(model.lora_targets), "head_width": width}


def checkpoint_bytes(trainable: int) -> int:
    """A training checkpoint: the LoRA adapter and PMA head in fp32 and AdamW's two fp32 moments (12 bytes each)."""
    return 12 * trainable


@dataclass(frozen=True)
class Recipe:
    arch: Arch
    lora_r: int = 64
    negatives: int = 7  # K
    max_length: int = 1024
    global_batch: int = 256  # ours (the paper does not state it); params/c2llm-*.yaml
    epochs: int = 3
    pairs: int = PAPER_PAIRS
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
    texts_per_step = recipe.global_batch * (2 + recipe.negatives)
    out["flops_per_step"] = step_flops(a, texts_per_step, mean, gradient_checkpointing, grad_cache, r)
    out["flops_total"] = out["flops_per_step"] * out["steps"]
    out["hours"] = out["flops_total"] / (gpus * H100_BF16_FLOPS * mfu) / 3600
    out["compute_in_forwards"] = out["flops_per_step"] / (texts_per_step * text_flops(a, mean, lora_r=r)["forward"])
    return out
