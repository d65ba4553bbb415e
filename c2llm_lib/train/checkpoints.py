"""Training checkpoints (paper section 4.1: the checkpoints that are merged) and what identifies a training, which a
resume or a merge must match. See docs/training.md#checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..config import ModelConfig, TrainConfig, from_dict
from ..files import CorruptFile, atomic_directory, load_json, load_tensors
from ..model import C2LLMEncoder
from .state import TrainerState
from .step import NonFiniteWeights

STATE_JSON = "trainer_state.json"  # step, scheduler, sampler, metrics, RNG of every rank, the training's identity

STATE_TENSORS = "trainer_state.safetensors"  # the optimizer's tensors

STATE_KEYS = ("step", "training", "optimizer", "scheduler", "sampler", "rng", "metrics", "checkpoints")


class CheckpointMismatch(ValueError):
    """A checkpoint written by another training (model, training config, rows or world size); names what differs."""


# the training's identity: what must match for a checkpoint to be resumed -------------------------------
def data_fingerprint(rows) -> str:
    """A content hash of the training rows: every column, in row order (the sampler depends on the order)."""
    columns = sorted(rows.column_names)
    digest = hashlib.blake2b(json.dumps([columns, len(rows)]).encode(), digest_size=12)
    for batch in rows.iter(batch_size=4096):
        digest.update(json.dumps([batch[c] for c in columns], default=str).encode())
    return digest.hexdigest()


def training_identity(
    model: ModelConfig, train: TrainConfig, fingerprint: str, world_size: int, dtype: str | None = None
) -> dict[str, Any]:
    """Model and training configs (device aside), rows fingerprint and world size; `dtype` as computed, never "auto"."""
    model_config = {k: v for k, v in model.to_dict().items() if k != "device"}
    if dtype is not None:
        model_config["dtype"] = dtype
    identity = {"model_config": model_config, "train_config": train.to_dict(), "data_fingerprint": fingerprint,
                "world_size": world_size}  # fmt: skip
    return json.loads(json.dumps(identity))


def config_differences(
    theirs: dict[str, Any], mine: dict[str, Any], defaults: dict[str, Any] | None = None
) -> list[str]:
    """'key: checkpoint's value, ours' per differing key; a key the checkpoint lacks counts as in `defaults`."""
    out = []
    defaults = defaults or {}
    for key in sorted(set(theirs) | set(mine)):
        a, b = theirs.get(key, defaults.get(key, "(absent)")), mine.get(key, "(absent)")
        if key != "device" and a != b:
            out.append(f"{key}: {a!r} in the checkpoint, {b!r} here")
    return out


def identity_differences(saved: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    out = []
    defaults = {"model_config": ModelConfig().to_dict(), "train_config": TrainConfig().to_dict()}
    defaults = json.loads(json.dumps(defaults))  # as JSON holds them
    for section in ("model_config", "train_config"):
        if not isinstance(saved.get(section), dict) or not saved[section]:  # defaults fill single keys, not sections
            out.append(f"{section}: not recorded in the checkpoint")
            continue
        out += config_differences(saved[section], ours[section], defaults[section])
    if saved.get("data_fingerprint") != ours["data_fingerprint"]:
        out.append(f"the training rows: fingerprint {saved.get('data_fingerprint')} in the checkpoint, "
                   f"{ours['data_fingerprint']} here")  # fmt: skip
    if saved.get("world_size") != ours["world_size"]:
        out.append(f"world size: {saved.get('world_size')} in the checkpoint, {ours['world_size']} here")
    return out


def save_checkpoint(directory: Path, encoder: C2LLMEncoder, trainer_state: TrainerState | None = None) -> Path:
    """Adapter + PMA head + model config [+ trainer state], written atomically; the weights must be finite."""
    if encoder.base_model is encoder.backbone:
        raise ValueError("checkpoints hold a LoRA adapter; this encoder has none (use_lora=False)")
    bad = [n for n, p in encoder.named_parameters() if p.requires_grad and not torch.isfinite(p).all()]
    if bad:
        raise NonFiniteWeights(f"not writing {directory}: non-finite trainable weights in {bad[:3]}")
    with atomic_directory(directory) as staging:
        encoder.backbone.save_pretrained(staging / "adapter")
        pooler = {k: v.detach().contiguous().cpu() for k, v in encoder.pooler.state_dict().items()}
        save_file(pooler, staging / "pooler.safetensors", metadata={"format": "pt"})
        (staging / "model_config.json").write_text(json.dumps(encoder.config.to_dict(), indent=2) + "\n")
        if trainer_state is not None:
            values, tensors = trainer_state
            save_file(tensors, staging / STATE_TENSORS, metadata={"format": "pt"})
            (staging / STATE_JSON).write_text(json.dumps(values, separators=(",", ":")) + "\n")
    return Path(directory)


@dataclass
class Checkpoint:
    path: Path
    adapter: dict[str, torch.Tensor]
    pooler: dict[str, torch.Tensor]
    model_config: dict[str, Any]
    state: dict[str, Any] | None = None  # trainer_state.json
    state_tensors: dict[str, torch.Tensor] | None = None  # trainer_state.safetensors


def read_checkpoint(directory: str | Path, with_state: bool = True) -> Checkpoint:
    """Reads and checks every file of a checkpoint; a pickled trainer state is refused unread."""
    directory = Path(directory)
    if not (directory / "adapter").is_dir():
        raise FileNotFoundError(f"{directory} is not a training checkpoint (no adapter/ folder)")
    load_json(directory / "adapter" / "adapter_config.json", "LoRA adapter configuration")
    adapter = load_tensors(directory / "adapter" / "adapter_model.safetensors", "LoRA adapter")
    pooler = load_tensors(directory / "pooler.safetensors", "PMA head")
    model_config = load_json(directory / "model_config.json", "model configuration")
    if not with_state:
        return Checkpoint(directory, adapter, pooler, model_config)
    pickled = directory / "trainer_state.pt"
    if pickled.exists() and not (directory / STATE_JSON).exists():
        raise CorruptFile(
            f"{pickled}: a trainer state in pickle format; refusing to load it (unpickling can run code). This "
            f"trainer writes {STATE_JSON} and {STATE_TENSORS}: resume from a checkpoint it wrote"
        )
    state = load_json(directory / STATE_JSON, "trainer state")
    missing = [k for k in STATE_KEYS if k not in state]
    if missing:
        raise CorruptFile(f"{directory / STATE_JSON}: the trainer state lacks {missing}")
    tensors = load_tensors(directory / STATE_TENSORS, "optimizer state")
    return Checkpoint(directory, adapter, pooler, model_config, state, tensors)


def apply_weights(checkpoint: Checkpoint, encoder: C2LLMEncoder) -> None:
    """Loads a checkpoint's adapter and PMA head into `encoder`, refusing one of another model configuration."""
    from peft import set_peft_model_state_dict

    differ = config_differences(checkpoint.model_config, json.loads(json.dumps(encoder.config.to_dict())))
    if differ:
        raise CheckpointMismatch(
            f"{checkpoint.path}: the checkpoint's model configuration differs from this model's in "
            + "; ".join(differ)
            + ". Build the model with the configuration that wrote the checkpoint"
        )
    result = set_peft_model_state_dict(encoder.backbone, checkpoint.adapter)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise CheckpointMismatch(f"{checkpoint.path}: adapter weights do not fit this encoder: {unexpected[:5]}")
    encoder.pooler.load_state_dict(checkpoint.pooler)


def encoder_from_checkpoint(directory: Path, device: str | None = None) -> C2LLMEncoder:
    """A fresh encoder (base backbone as configured) carrying the checkpoint's adapter and head."""
    checkpoint = read_checkpoint(directory, with_state=False)
    cfg = from_dict(ModelConfig, checkpoint.model_config, str(Path(directory) / "model_config.json"))
    if device:
        cfg.device = device
    encoder = C2LLMEncoder.from_config(cfg)
    apply_weights(checkpoint, encoder)
    return encoder


def move_aside(folder: Path, label: str) -> Path:
    """Renames `folder` to `<folder>.<label>-<timestamp>` beside it (never deleting anything); returns the new path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = folder.with_name(f"{folder.name}.{label}-{stamp}"), 1
    while target.exists():
        target, n = folder.with_name(f"{folder.name}.{label}-{stamp}-{n}"), n + 1
    os.replace(folder, target)
    return target


def recorded_identity(record: dict[str, Any], source: str | Path) -> dict[str, Any]:
    """The `training_identity` that notebook 02's `metrics/train.json` describes."""
    missing = [k for k in ("model_config", "train_config", "data_fingerprint", "processes") if k not in record]
    if missing:
        raise CorruptFile(f"{source}: the training record lacks {missing}; rerun 02_train_lora_contrastive")
    model = from_dict(ModelConfig, record["model_config"], str(source))
    train = from_dict(TrainConfig, record["train_config"], str(source))
    return training_identity(model, train, record["data_fingerprint"], record["processes"])


def check_written_by(checkpoint: Path, identity: dict[str, Any], source: str | Path) -> None:
    """Refuses a checkpoint recording another training than `identity` (or none), naming what differs."""
    saved = load_json(checkpoint / STATE_JSON, "trainer state").get("training")
    differ = identity_differences(saved, identity) if isinstance(saved, dict) else ["it records no training identity"]
    if differ:
        described = "; ".join(d.removesuffix(" here") + " in the record" if d.endswith(" here") else d for d in differ)
        raise CheckpointMismatch(
            f"{checkpoint} was written by another training than {source} records: {described}. Rerun "
            "02_train_lora_contrastive, which writes this training's checkpoints"
        )


def checkpoints_to_merge(train_record: str | Path, checkpoints_dir: str | Path, last: int) -> list[Path]:
    """The last `last` checkpoints that notebook 02's `metrics/train.json` lists, each checked by `check_written_by`."""
    record = load_json(train_record, "training record")
    listed = record.get("checkpoints")
    if not isinstance(listed, list) or not all(isinstance(c, str) for c in listed):
        raise CorruptFile(f"{train_record}: 'checkpoints' must be a list of checkpoint paths, got {listed!r}")
    paths = [Path(checkpoints_dir) / Path(c).name for c in listed]
    if len(paths) < last:
        raise ValueError(
            f"{train_record}: the training wrote {len(paths)} checkpoint(s) ({[p.name for p in paths]}), fewer "
            f"than merge_last = {last}; lower merge_last, or checkpoint more steps (checkpoint_fractions)"
        )
    chosen = paths[len(paths) - last :]
    missing = [str(p) for p in chosen if not p.is_dir()]
    if missing:
        raise FileNotFoundError(f"{train_record} lists {missing}, which are missing: rerun 02_train_lora_contrastive")
    identity = recorded_identity(record, train_record)
    for checkpoint in chosen:
        check_written_by(checkpoint, identity, train_record)
    return chosen
