"""Weighted merging of training checkpoints (paper section 4.1: four checkpoints at different steps).

Each checkpoint holds a LoRA adapter (A, B per target module) and a PMA head. Merging LoRA factors
directly is wrong: averaging the A's and the B's separately (peft's
`add_weighted_adapter(combination_type="linear")`) gives sum_i w_i B_i times sum_j w_j A_j, which has
cross terms B_i A_j and is not the weighted update. Here every checkpoint's adapter becomes its dense
update Delta_i = (alpha / r) B_i A_i, and the merged weight is W = W_base + sum_i w_i Delta_i. The
PMA head's parameters are averaged with the same weights. The result is a plain encoder with no
adapter, which `save_pretrained` writes as a standalone directory that `C2LLMEncoder.from_pretrained`
loads.

Weights must be non-negative, one per checkpoint, and not all zero. Weights that do not sum to 1 are
normalised, and the returned note says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from .config import ModelConfig, from_dict
from .model import C2LLMEncoder


@dataclass
class MergeResult:
    encoder: C2LLMEncoder
    weights: list[float]  # as used, summing to 1
    note: str  # what was done to the weights, if anything


def check_weights(weights: Sequence[float], n: int) -> tuple[list[float], str]:
    """Validated weights summing to 1, and a note when they had to be normalised."""
    if len(weights) != n:
        raise ValueError(f"{len(weights)} merge weights for {n} checkpoints: give one weight per checkpoint")
    if any((not isinstance(w, (int, float))) or w != w or w < 0 for w in weights):
        raise ValueError(f"merge weights must be non-negative numbers, got {list(weights)}")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"merge weights {list(weights)} are all zero")
    if abs(total - 1.0) <= 1e-6:
        return [float(w) for w in weights], ""
    normalised = [w / total for w in weights]
    return normalised, f"weights {list(weights)} sum to {total:g}; normalised to {[round(w, 6) for w in normalised]}"


def lora_deltas(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Dense updates (alpha / r) * B @ A of one checkpoint, keyed by the base weight's name."""
    config = json.loads((checkpoint / "adapter" / "adapter_config.json").read_text())
    if config.get("use_rslora") or config.get("use_dora"):
        raise ValueError(f"{checkpoint}: rsLoRA/DoRA adapters are not merged by this module")
    scale = config["lora_alpha"] / config["r"]
    tensors = load_file(checkpoint / "adapter" / "adapter_model.safetensors")
    deltas = {}
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        b = tensors[key.replace(".lora_A.", ".lora_B.")]
        module = key.split(".lora_A.")[0].removeprefix("base_model.model.")
        deltas[f"{module}.weight"] = scale * (b.float() @ a.float())  # (out, in)
    if not deltas:
        raise ValueError(f"{checkpoint}: the adapter holds no LoRA weights")
    return deltas


def merge_checkpoints(checkpoints: Sequence[str | Path], weights: Sequence[float], device: str = "cpu") -> MergeResult:
    """The weighted merge of training checkpoints (same base model and head shape) as a plain encoder."""
    paths = [Path(c) for c in checkpoints]
    if not paths:
        raise ValueError("no checkpoints to merge")
    for path in paths:
        for needed in ("model_config.json", "pooler.safetensors", "adapter/adapter_config.json"):
            if not (path / needed).is_file():
                raise FileNotFoundError(f"{path / needed} not found: {path} is not a training checkpoint")
    weights, note = check_weights(weights, len(paths))
    configs = [json.loads((p / "model_config.json").read_text()) for p in paths]
    architecture = ("backbone", "backbone_revision", "gguf_file", "pooling", "pma_heads", "embedding_dim")
    for path, cfg in zip(paths[1:], configs[1:], strict=True):
        differing = [k for k in architecture if cfg.get(k) != configs[0].get(k)]
        if differing:
            raise ValueError(f"{path} differs from {paths[0]} in {differing}: checkpoints of different models")
    base_cfg = replace(
        from_dict(ModelConfig, configs[0], str(paths[0])), use_lora=False, device=device, gradient_checkpointing=False
    )
    encoder = C2LLMEncoder.from_config(base_cfg)
    params = dict(encoder.base_model.named_parameters())
    with torch.no_grad():
        total: dict[str, torch.Tensor] = {}
        for w, path in zip(weights, paths, strict=True):
            for name, delta in lora_deltas(path).items():
                if name not in params:
                    raise ValueError(f"{path}: the adapter targets {name}, which the base model does not have")
                total[name] = total.get(name, 0) + w * delta
        for name, delta in total.items():
            params[name].add_(delta.to(params[name].dtype).to(params[name].device))
        poolers = [load_file(p / "pooler.safetensors") for p in paths]
        merged = {k: sum(w * sd[k].float() for w, sd in zip(weights, poolers, strict=True)) for k in poolers[0]}
        encoder.pooler.load_state_dict(merged)
    return MergeResult(encoder, weights, note)
