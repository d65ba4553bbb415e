"""Weighted merging of training checkpoints (paper section 4.1): W = W_base + sum_i w_i (alpha / r) B_i A_i in float32,
the PMA head averaged; `merge_as_adapter` is its exact low-rank form. See docs/training.md#the-merge.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .config import ModelConfig, from_dict
from .files import load_json, load_tensors
from .hardware import resolve_device, resolve_dtype
from .model import C2LLMEncoder
from .model.backbone import add_lora

ARCHITECTURE = ("backbone", "backbone_revision", "gguf_file", "pooling", "pma_heads", "embedding_dim")
PROMPTS = ("prompt_style", "document_prefix")


@dataclass
class MergeResult:
    encoder: C2LLMEncoder  # float32 backbone and head (merge_checkpoints), or base + one adapter (merge_as_adapter)
    weights: list[float]  # as used, summing to 1
    note: str  # what was done to the weights, if anything
    # merge_checkpoints after 16-bit training: the base model as trained (copied before the upcast), from which
    # `evaluation_form` builds the adapter form without loading the backbone again (a GGUF: ~40 s on 2 cores)
    base: C2LLMEncoder | None = None


def check_weights(weights: Sequence[float], n: int) -> tuple[list[float], str]:
    """Validated weights summing to 1, and a note when they had to be normalised."""
    if len(weights) != n:
        raise ValueError(f"{len(weights)} merge weights for {n} checkpoints: give one weight per checkpoint")
    if any(isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"merge weights must be finite non-negative numbers, got {list(weights)}")
    total = sum(float(w) for w in weights)
    if not math.isfinite(total):
        raise ValueError(f"merge weights {list(weights)} overflow when summed; give them on a smaller scale")
    if total <= 0:
        raise ValueError(f"merge weights {list(weights)} are all zero")
    if abs(total - 1.0) <= 1e-6:
        return [float(w) for w in weights], ""
    normalised = [w / total for w in weights]
    return normalised, f"weights {list(weights)} sum to {total:g}; normalised to {[round(w, 6) for w in normalised]}"


def lora_factors(checkpoint: Path) -> tuple[float, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """alpha / r and {base weight name: (A (r, in), B (out, r)) in float32} of one checkpoint's adapter."""
    checkpoint = Path(checkpoint)
    config = load_json(checkpoint / "adapter" / "adapter_config.json", "adapter config")
    if config.get("use_rslora") or config.get("use_dora"):
        raise ValueError(f"{checkpoint}: rsLoRA/DoRA adapters are not merged by this module")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError(f"{checkpoint}: adapters with per-module ranks (rank_pattern) are not merged by this module")
    scale = config["lora_alpha"] / config["r"]
    weights_file = checkpoint / "adapter" / "adapter_model.safetensors"
    tensors = load_tensors(weights_file, "adapter weights")
    factors = {}
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        b_key = key.replace(".lora_A.", ".lora_B.")
        if b_key not in tensors:
            raise ValueError(f"{weights_file}: {key} has no matching {b_key}")
        module = key.split(".lora_A.")[0].removeprefix("base_model.model.")
        a, b = a.float(), tensors[b_key].float()
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise ValueError(f"{weights_file}: the update of {module} is not finite (inf or NaN in its LoRA factors)")
        factors[f"{module}.weight"] = (a, b)
    if not factors:
        raise ValueError(f"{checkpoint}: the adapter holds no LoRA weights")
    return scale, factors


def check_compatible(paths: Sequence[Path], configs: Sequence[dict]) -> None:
    """Raises unless every checkpoint is of the same model and was trained with the same prompts."""
    for path, cfg in zip(paths[1:], configs[1:], strict=True):
        differing = [k for k in ARCHITECTURE if cfg.get(k) != configs[0].get(k)]
        if differing:
            raise ValueError(f"{path} differs from {paths[0]} in {differing}: checkpoints of different models")
        for key in PROMPTS:
            if cfg.get(key) != configs[0].get(key):
                raise ValueError(
                    f"{paths[0]} was trained with {key}={configs[0].get(key)!r} and {path} with "
                    f"{key}={cfg.get(key)!r}: checkpoints trained with different prompts are not merged "
                    "(the merge is evaluated with one prompt set)"
                )


def checked_checkpoints(
    checkpoints: Sequence[str | Path], weights: Sequence[float], device: str
) -> tuple[list[Path], list[float], str, ModelConfig]:
    """(paths, weights as used, their note, the model config with LoRA off); raises on anything unmergeable."""
    paths = [Path(c) for c in checkpoints]
    if not paths:
        raise ValueError("no checkpoints to merge")
    for path in paths:
        for needed in ("model_config.json", "pooler.safetensors", "adapter/adapter_config.json"):
            if not (path / needed).is_file():
                raise FileNotFoundError(f"{path / needed} not found: {path} is not a training checkpoint")
    weights, note = check_weights(weights, len(paths))
    configs = [load_json(p / "model_config.json", "model config") for p in paths]
    check_compatible(paths, configs)
    trained = replace(
        from_dict(ModelConfig, configs[0], str(paths[0] / "model_config.json")),
        use_lora=False,
        device=device,
        gradient_checkpointing=False,
    )
    return paths, weights, note, trained


def merged_head(paths: Sequence[Path], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """The PMA head's parameters averaged with the merge weights (float32)."""
    poolers = [load_tensors(p / "pooler.safetensors", "PMA head weights") for p in paths]
    for path, head in zip(paths[1:], poolers[1:], strict=True):
        if set(head) != set(poolers[0]):
            raise ValueError(f"{path}/pooler.safetensors holds {sorted(head)}, {paths[0]} {sorted(poolers[0])}")
    return {k: sum(w * sd[k].float() for w, sd in zip(weights, poolers, strict=True)) for k in poolers[0]}


def merge_checkpoints(checkpoints: Sequence[str | Path], weights: Sequence[float], device: str = "cpu") -> MergeResult:
    """The weighted merge of training checkpoints (same base model and head shape) as a float32 encoder."""
    paths, weights, note, trained = checked_checkpoints(checkpoints, weights, device)
    encoder = C2LLMEncoder.from_config(trained)  # the base weights in the dtype the checkpoints trained in
    as_trained = None
    if next(encoder.base_model.parameters()).dtype != torch.float32:
        as_trained = C2LLMEncoder(copy.deepcopy(encoder.base_model), encoder.tokenizer, trained)
        as_trained.base_loaded_as = encoder.base_loaded_as
    base = encoder.base_model.float()  # exact upcast: every bf16/fp16 value is a float32 value
    if base.config._attn_implementation == "flash_attention_2":  # flash-attention has no float32 kernels
        base.set_attn_implementation("sdpa")
    attn = "auto" if trained.attn_implementation == "flash_attention_2" else trained.attn_implementation
    encoder.config = replace(trained, dtype="float32", attn_implementation=attn)
    encoder.base_loaded_as = None  # its base takes the update: no longer the source's
    params = dict(base.named_parameters())
    loaded = [lora_factors(p) for p in paths]  # the low-rank factors only: every dense update at once would be as
    # large as the backbone's linear weights (1.4 GB float32 for the 0.5B model), and was, with one checkpoint's
    with torch.no_grad():
        for name in dict.fromkeys(name for _, factors in loaded for name in factors):  # in first-seen order
            if name not in params:
                path = next(p for p, (_, factors) in zip(paths, loaded, strict=True) if name in factors)
                raise ValueError(f"{path}: the adapter targets {name}, which the base model does not have")
            total = 0
            for w, (scale, factors) in zip(weights, loaded, strict=True):
                if name in factors:
                    a, b = factors[name]
                    total = total + w * (scale * (b @ a))  # (out, r) @ (r, in) -> (out, in), float32
            params[name].add_(total.to(params[name].device))  # float32 + float32: the update survives
        encoder.pooler.load_state_dict(merged_head(paths, weights))
    return MergeResult(encoder, weights, note, as_trained)


def merge_as_adapter(
    checkpoints: Sequence[str | Path], weights: Sequence[float], device: str = "cpu", base: C2LLMEncoder | None = None
) -> MergeResult:
    """`merge_checkpoints` as one LoRA adapter over the base in the training dtype: A stacks w_i (alpha_i / r_i) A_i, B
    stacks B_i, alpha = rank. Eval mode, adapter frozen. `base`: that base already loaded (`MergeResult.base`), which
    becomes the adapter form's own (LoRA is added to it in place); else it is loaded."""
    paths, weights, note, trained = checked_checkpoints(checkpoints, weights, device)
    loaded = [lora_factors(p) for p in paths]
    ranks = [next(iter(f.values()))[0].shape[0] for _, f in loaded]
    rank = sum(ranks)
    modules = sorted({name for _, f in loaded for name in f})
    targets = sorted({name.removesuffix(".weight").rsplit(".", 1)[-1] for name in modules})
    config = replace(trained, use_lora=True, lora_r=rank, lora_alpha=rank, lora_dropout=0.0, lora_targets=targets)
    if base is None or base.device != resolve_device(device):
        encoder = C2LLMEncoder.from_config(config)
    else:
        encoder = C2LLMEncoder(add_lora(base.backbone, config), base.tokenizer, config)
        encoder.base_loaded_as = base.base_loaded_as
    params = dict(encoder.backbone.named_parameters())
    with torch.no_grad():
        for name in modules:
            prefix = "base_model.model." + name.removesuffix(".weight")
            a_key, b_key = f"{prefix}.lora_A.default.weight", f"{prefix}.lora_B.default.weight"
            if a_key not in params:
                raise ValueError(f"{paths[0]}: the adapters target {name}, which the base model does not have")
            a_rows, b_cols = [], []
            for path, (scale, factors), w, r in zip(paths, loaded, weights, ranks, strict=True):
                a, b = factors.get(name, (None, None))
                if a is None:
                    a = torch.zeros(r, params[a_key].shape[1])
                    b = torch.zeros(params[b_key].shape[0], r)
                if a.shape[0] != r:
                    raise ValueError(f"{path}: {name} has rank {a.shape[0]} where the adapter's other modules have {r}")
                a_rows.append(w * scale * a)  # (r_i, in)
                b_cols.append(b)  # (out, r_i)
            params[a_key].copy_(torch.cat(a_rows, dim=0))  # (R, in)
            params[b_key].copy_(torch.cat(b_cols, dim=1))  # (out, R)
        encoder.pooler.load_state_dict(merged_head(paths, weights))
    encoder.backbone.requires_grad_(False)
    return MergeResult(encoder.eval(), weights, note)


def evaluation_form(
    checkpoints: Sequence[str | Path], weights: Sequence[float], dense: MergeResult, device: str = "cpu"
) -> C2LLMEncoder:
    """What `merged/` holds: after 16-bit training `merge_as_adapter`'s form (on `dense`'s copy of the base, handed
    over: `dense.base` is None after), after float32 training `dense`'s encoder itself."""
    trained = checked_checkpoints(checkpoints, weights, device)[3]
    if resolve_dtype(trained.dtype, resolve_device(trained.device)) == torch.float32:
        return dense.encoder
    base, dense.base = dense.base, None
    return merge_as_adapter(checkpoints, weights, device, base).encoder
