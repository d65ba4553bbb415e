"""Weighted merging of training checkpoints (paper section 4.1: four checkpoints at different steps).

Each checkpoint holds a LoRA adapter (A, B per target module) and a PMA head. Merging LoRA factors
directly is wrong: averaging the A's and the B's separately (peft's
`add_weighted_adapter(combination_type="linear")`) gives sum_i w_i B_i times sum_j w_j A_j, which has
cross terms B_i A_j and is not the weighted update. Here every checkpoint's adapter becomes its dense
update Delta_i = (alpha / r) B_i A_i, and the merged weight is W = W_base + sum_i w_i Delta_i. The
PMA head's parameters are averaged with the same weights. The result is a plain encoder with no
adapter, which `save_pretrained` writes as a standalone directory that `C2LLMEncoder.from_pretrained`
loads.

The merged backbone is float32, whatever dtype the checkpoints trained in. The base weights are loaded
in the checkpoints' dtype (the weights training saw), upcast exactly to float32, and the float32 update is
added there. A LoRA update is often smaller than half a bf16 ulp of the weight it changes (bf16 stores a
weight near 0.02 to the nearest 1.2e-4), so adding it into a bf16 weight rounds much of it away: merged in
bf16, the tiny test model's merged update was off by 69 % of its norm with LoRA B ~ 2e-4 (22 % with B ~ 1e-3);
merged in float32, by less than 0.01 %. The merged directory is therefore twice the size of a bf16 one, and
it loads as float32 unless `from_pretrained(dtype=...)` asks otherwise (which rounds the update again).

Weights must be finite, non-negative, one per checkpoint, and not all zero. Weights that do not sum to 1
are normalised, and the returned note says so. Checkpoints of different models, or trained with different
prompts (`prompt_style`, `document_prefix`), are refused: their merge would be evaluated with one prompt set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .config import ModelConfig, from_dict
from .files import load_json, load_tensors
from .model import C2LLMEncoder

ARCHITECTURE = ("backbone", "backbone_revision", "gguf_file", "pooling", "pma_heads", "embedding_dim")
PROMPTS = ("prompt_style", "document_prefix")


@dataclass
class MergeResult:
    encoder: C2LLMEncoder  # float32 backbone and head
    weights: list[float]  # as used, summing to 1
    note: str  # what was done to the weights, if anything


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


def lora_deltas(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Dense float32 updates (alpha / r) * B @ A of one checkpoint, keyed by the base weight's name."""
    checkpoint = Path(checkpoint)
    config = load_json(checkpoint / "adapter" / "adapter_config.json", "adapter config")
    if config.get("use_rslora") or config.get("use_dora"):
        raise ValueError(f"{checkpoint}: rsLoRA/DoRA adapters are not merged by this module")
    scale = config["lora_alpha"] / config["r"]
    weights_file = checkpoint / "adapter" / "adapter_model.safetensors"
    tensors = load_tensors(weights_file, "adapter weights")
    deltas = {}
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        b_key = key.replace(".lora_A.", ".lora_B.")
        if b_key not in tensors:
            raise ValueError(f"{weights_file}: {key} has no matching {b_key}")
        module = key.split(".lora_A.")[0].removeprefix("base_model.model.")
        delta = scale * (tensors[b_key].float() @ a.float())  # (out, r) @ (r, in) -> (out, in)
        if not torch.isfinite(delta).all():
            raise ValueError(f"{weights_file}: the update of {module} is not finite (inf or NaN in its LoRA factors)")
        deltas[f"{module}.weight"] = delta
    if not deltas:
        raise ValueError(f"{checkpoint}: the adapter holds no LoRA weights")
    return deltas


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


def merge_checkpoints(checkpoints: Sequence[str | Path], weights: Sequence[float], device: str = "cpu") -> MergeResult:
    """The weighted merge of training checkpoints (same base model and head shape) as a float32 encoder."""
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
    encoder = C2LLMEncoder.from_config(trained)  # the base weights in the dtype the checkpoints trained in
    base = encoder.base_model.float()  # exact upcast: every bf16/fp16 value is a float32 value
    if base.config._attn_implementation == "flash_attention_2":  # flash-attention has no float32 kernels
        base.set_attn_implementation("sdpa")
    attn = "auto" if trained.attn_implementation == "flash_attention_2" else trained.attn_implementation
    encoder.config = replace(trained, dtype="float32", attn_implementation=attn)
    params = dict(base.named_parameters())
    with torch.no_grad():
        total: dict[str, torch.Tensor] = {}
        for w, path in zip(weights, paths, strict=True):
            for name, delta in lora_deltas(path).items():
                if name not in params:
                    raise ValueError(f"{path}: the adapter targets {name}, which the base model does not have")
                total[name] = total.get(name, 0) + w * delta  # (out, in), float32
        for name, delta in total.items():
            params[name].add_(delta.to(params[name].device))  # float32 + float32: the update survives
        poolers = [load_tensors(p / "pooler.safetensors", "PMA head weights") for p in paths]
        for path, head in zip(paths[1:], poolers[1:], strict=True):
            if set(head) != set(poolers[0]):
                raise ValueError(f"{path}/pooler.safetensors holds {sorted(head)}, {paths[0]} {sorted(poolers[0])}")
        merged = {k: sum(w * sd[k].float() for w, sd in zip(weights, poolers, strict=True)) for k in poolers[0]}
        encoder.pooler.load_state_dict(merged)
    return MergeResult(encoder, weights, note)
