"""Contrastive LoRA training (paper section 4.1), on torchrun + DDP or a single process.

`TrainStep` is one optimizer step, `Trainer` the loop around it (metrics, checkpoints, resuming); `main` is the
torchrun entry point that notebook 02 starts for more than one process (`launch.py`).

One optimizer step = one global batch from one (dataset, language) group (`samplers.py`): each rank
embeds its slice of queries (with the row's instruction, or the prompt set of the encoder's
`prompt_style`), positives and K hard negatives (with the document prefix), and
`losses.contrastive_loss` scores local queries against the whole global batch (with `mrl_dims`,
`losses.matryoshka_loss`: the same loss also on the first d coordinates for each d). The LoRA adapters and
the PMA head train (the head may have its own learning rate), with AdamW, linear warmup then a cosine (or
linear) decay counted in *optimizer steps* (the scheduler is stepped once per step on every rank, never once
per process), and gradient clipping.

No compute goes to padding that sorting can avoid: queries and documents are embedded apart, each sorted by
token length into micro-batches (`micro_batches`: at most `grad_cache_chunk` x `max_length` token slots each,
grouped to compute the fewest slots), and the embeddings are put back in the rows' order. Rows are left-padded
with position ids counting real tokens, so an embedding does not depend on its micro-batch, and the loss and
gradients are those of one padded forward of every text (tested). Each step logs its real `tokens` and its
`padding_efficiency` (real tokens / computed token slots). Variable-length packing (one row, block-diagonal
attention) would leave no padding at all, but on a CPU the sdpa kernel computes the whole pack's square.

GradCache (`grad_cache=True`): embed all texts micro-batch by micro-batch without a graph, compute the loss
and its gradient with respect to the embeddings, then re-embed each micro-batch with a graph and backpropagate
the cached gradients. Memory then depends on the micro-batch's token budget, not the global batch, at the cost
of one more forward pass; the loss and gradients are those of the plain step (tested).

Checkpoints (the paper merges "four checkpoints captured at different global steps") are written at
`checkpoint_steps` and at `checkpoint_fractions` of the run's optimizer steps (so that [0.7, 0.8, 0.9, 1.0]
gives 4 late checkpoints at any run length), atomically (a staging folder renamed into place): the LoRA
adapter and PMA head in safetensors, and the trainer state with no pickle in it: optimizer tensors in
`trainer_state.safetensors`, and in `trainer_state.json` the step, scheduler, sampler, metrics, every
rank's own RNG state, and what identifies the training (model and training configs, a fingerprint of
the rows, the world size). A killed run resumed from its last checkpoint ends with the same weights as
an uninterrupted one (tested); resuming refuses a checkpoint of another training, naming what differs,
and a corrupt file is named with what is wrong. `Trainer.resume_latest` is what notebook 02 does (in its
kernel, or on every rank through `--resume-latest`): it resumes the same training from its last complete
checkpoint, and moves another training's checkpoints aside (never deleting them).

A non-finite loss on any rank stops every rank (the ranks agree before the backward pass) with one
message naming the step and dataset; a non-finite weight after an update stops the run before that
step is checkpointed. Either way every checkpoint on disk holds finite weights. The logged losses are
means over all ranks.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from .atomic import atomic_directory
from .batching import micro_batches
from .config import ConfigError, LaunchConfig, ModelConfig, TrainConfig, from_dict
from .data.records import text_key
from .distributed import all_gather_json, all_ranks_true, barrier, gather_without_grad, world
from .files import CorruptFile, load_json, load_tensors
from .losses import contrastive_loss, matryoshka_loss
from .model import C2LLMEncoder
from .prompts import prompts
from .samplers import GroupedBatchSampler

STATE_JSON = "trainer_state.json"  # step, scheduler, sampler, metrics, RNG of every rank, the training's identity
STATE_TENSORS = "trainer_state.safetensors"  # the optimizer's tensors
STATE_KEYS = ("step", "training", "optimizer", "scheduler", "sampler", "rng", "metrics", "checkpoints")


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite on some rank; every rank stopped before updating anything."""


class NonFiniteWeights(RuntimeError):
    """An update made a trainable weight NaN or infinite; the run stopped before checkpointing it."""


class CheckpointMismatch(ValueError):
    """A checkpoint written by another training (model, training config, rows or world size); names what differs."""


def lr_lambda(warmup: int, total: int, min_ratio: float, schedule: str = "cosine"):
    """Multiplier of the peak learning rate at optimizer step s (0-based): linear warmup, then a cosine or
    linear decay to `min_ratio` at the last step."""
    if schedule not in ("cosine", "linear"):
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; choose cosine or linear")

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        decay = 1 - progress if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return min_ratio + (1 - min_ratio) * decay

    return factor


def checkpoint_schedule(cfg: TrainConfig, total_steps: int) -> list[int]:
    """The optimizer steps to checkpoint: `checkpoint_steps`, and each of `checkpoint_fractions` of `total_steps`
    rounded half up (at least step 1; 1.0 is the last step), sorted and deduplicated. A checkpoint step beyond
    the training is an error naming it (it would silently never be written)."""
    beyond = sorted(s for s in cfg.checkpoint_steps if s > total_steps)
    if beyond:
        raise ConfigError(
            f"parameter 'checkpoint_steps' {beyond} lie beyond this training's {total_steps} optimizer steps; "
            "lower them, or use checkpoint_fractions (e.g. [0.7, 0.8, 0.9, 1.0]), which scale with the run"
        )
    from_fractions = {min(total_steps, max(1, math.floor(f * total_steps + 0.5))) for f in cfg.checkpoint_fractions}
    return sorted(set(cfg.checkpoint_steps) | from_fractions)


# RNG states: in memory as the libraries give them, on disk as JSON lists ------------------------------
def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rng_to_json(state: dict[str, Any]) -> dict[str, Any]:
    """`rng_state()` as plain lists and numbers (no pickle needed to store or read it)."""
    version, internal, gauss = state["python"]
    name, keys, pos, has_gauss, cached = state["numpy"]
    out = {"python": [version, list(internal), gauss], "numpy": [name, keys.tolist(), int(pos), int(has_gauss),
           float(cached)], "torch": state["torch"].tolist()}  # fmt: skip
    if "cuda" in state:
        out["cuda"] = [s.tolist() for s in state["cuda"]]
    return out


def rng_from_json(value: Any, source: str | Path) -> dict[str, Any]:
    """The inverse of `rng_to_json`; a malformed state is an error naming `source`."""
    try:
        version, internal, gauss = value["python"]
        name, keys, pos, has_gauss, cached = value["numpy"]
        state = {
            "python": (int(version), tuple(int(x) for x in internal), gauss),
            "numpy": (str(name), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)),
            "torch": torch.tensor(value["torch"], dtype=torch.uint8),
        }
        if "cuda" in value:
            state["cuda"] = [torch.tensor(s, dtype=torch.uint8) for s in value["cuda"]]
    except (KeyError, TypeError, ValueError) as err:
        raise CorruptFile(f"{source}: the saved RNG state is malformed ({type(err).__name__}: {err})") from None
    return state


# the training's identity: what must match for a checkpoint to be resumed -------------------------------
def data_fingerprint(rows) -> str:
    """A content hash of the training rows: every column, in row order (the sampler depends on the order)."""
    columns = sorted(rows.column_names)
    digest = hashlib.blake2b(json.dumps([columns, len(rows)]).encode(), digest_size=12)
    for batch in rows.iter(batch_size=4096):
        digest.update(json.dumps([batch[c] for c in columns], default=str).encode())
    return digest.hexdigest()


def training_identity(model: ModelConfig, train: TrainConfig, fingerprint: str, world_size: int) -> dict[str, Any]:
    """Model and training configs (the device left out: where it runs does not change the training), the rows'
    fingerprint and the world size, normalised as JSON holds them."""
    model_config = {k: v for k, v in model.to_dict().items() if k != "device"}
    identity = {"model_config": model_config, "train_config": train.to_dict(), "data_fingerprint": fingerprint,
                "world_size": world_size}  # fmt: skip
    return json.loads(json.dumps(identity))


def config_differences(
    theirs: dict[str, Any], mine: dict[str, Any], defaults: dict[str, Any] | None = None
) -> list[str]:
    """'key: value in the checkpoint, value here' for each differing key (the device aside). A key the checkpoint
    lacks counts as its value in `defaults` (a setting added to the config later, at the value every older training
    had), so a checkpoint written before the setting existed still resumes while the setting is left at its default."""
    out = []
    defaults = defaults or {}
    for key in sorted(set(theirs) | set(mine)):
        a, b = theirs.get(key, defaults.get(key, "(absent)")), mine.get(key, "(absent)")
        if key != "device" and a != b:
            out.append(f"{key}: {a!r} in the checkpoint, {b!r} here")
    return out


def identity_differences(saved: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """What differs between a checkpoint's training identity and this run's, one phrase per key."""
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


# checkpoints on disk ----------------------------------------------------------------------------------
def optimizer_to_state(state_dict: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """An optimizer state_dict as (JSON part, tensors): tensors keyed `optimizer.<param id>.<name>`."""
    tensors, scalars = {}, {}
    for pid, values in state_dict["state"].items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{pid}.{name}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(pid), {})[name] = value
    return {"param_groups": state_dict["param_groups"], "scalars": scalars}, tensors


def optimizer_from_state(value: dict[str, Any], tensors: dict[str, torch.Tensor], source: str | Path) -> dict:
    """The inverse of `optimizer_to_state` (param ids back to ints, as `load_state_dict` matches them)."""
    try:
        state: dict[int, dict[str, Any]] = {}
        for key, tensor in tensors.items():
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = tensor
        for pid, values in value["scalars"].items():
            state.setdefault(int(pid), {}).update(values)
        return {"state": state, "param_groups": value["param_groups"]}
    except (KeyError, TypeError, ValueError) as err:
        raise CorruptFile(f"{source}: the saved optimizer state is malformed ({type(err).__name__}: {err})") from None


TrainerState = tuple[dict[str, Any], dict[str, torch.Tensor]]  # (the JSON part, the optimizer's tensors)


def save_checkpoint(directory: Path, encoder: C2LLMEncoder, trainer_state: TrainerState | None = None) -> Path:
    """Adapter + PMA head (safetensors) + the model config [+ trainer state: JSON and safetensors], written
    atomically. The weights must be finite: a checkpoint is a point to return to."""
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
    """A training checkpoint, every file read and checked (`read_checkpoint`)."""

    path: Path
    adapter: dict[str, torch.Tensor]
    pooler: dict[str, torch.Tensor]
    model_config: dict[str, Any]
    state: dict[str, Any] | None = None  # trainer_state.json
    state_tensors: dict[str, torch.Tensor] | None = None  # trainer_state.safetensors


def read_checkpoint(directory: str | Path, with_state: bool = True) -> Checkpoint:
    """Reads every file of a checkpoint; a missing, truncated or corrupt file is an error naming it and what is
    wrong, and a pickled trainer state (an older format, or a crafted file) is refused unread."""
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


def load_checkpoint_weights(directory: Path, encoder: C2LLMEncoder) -> None:
    """Loads a checkpoint's adapter and PMA head into an encoder built with the same ModelConfig."""
    apply_weights(read_checkpoint(directory, with_state=False), encoder)


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


def checkpoints_to_merge(train_record: str | Path, checkpoints_dir: str | Path, last: int) -> list[Path]:
    """The last `last` checkpoints of the training that notebook 02's `metrics/train.json` describes (its
    "checkpoints", in step order), found by name in `checkpoints_dir`. Only that training's checkpoints are
    merged, whatever else the folder holds; too few, or a listed one missing, is an error naming them."""
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
    return chosen


@dataclass
class TrainResult:
    steps: int
    metrics: list[dict[str, Any]]
    checkpoints: list[str]
    seconds: float


def head_groups(pooler: torch.nn.Module, lr: float, attention_lr: float) -> list[dict[str, Any]]:
    """The pooler's optimizer groups: its trainable parameters at `lr`, except, when `attention_lr` differs, a PMA
    head's attention parameters (`PMAHead.attention_parameters`) in a group of their own at `attention_lr`. Poolers
    without parameters give an empty group."""
    attention = getattr(pooler, "attention_parameters", list)() if attention_lr != lr else []  # [] for other poolers
    split = {id(p) for p in attention}
    return [
        {"params": [p for p in pooler.parameters() if p.requires_grad and id(p) not in split], "lr": lr},
        {"params": [p for p in attention if p.requires_grad], "lr": attention_lr},
    ]


class TrainStep:
    """One optimizer step on one global batch: embed its texts in length-sorted micro-batches (with GradCache, twice),
    the loss over the global batch, the ranks' agreement that it is finite, backward, clipping, the AdamW update, the
    check that the weights stayed finite, and the scheduler's step. `Trainer` adds the loop around it."""

    def __init__(self, encoder: C2LLMEncoder, cfg: TrainConfig):
        if encoder.base_model is encoder.backbone:
            raise ValueError("training needs LoRA: build the encoder with use_lora=True")
        too_wide = [d for d in cfg.mrl_dims if d >= encoder.embedding_dim]
        if too_wide:
            raise ValueError(
                f"mrl_dims {too_wide} are not below the embedding width {encoder.embedding_dim} (the full width "
                "is always trained; list only the smaller widths)"
            )
        self.encoder, self.cfg = encoder, cfg
        self.rank, self.world_size = world()
        pma_lr = cfg.learning_rate if cfg.pma_learning_rate is None else cfg.pma_learning_rate
        if pma_lr == 0:  # a frozen head: no gradient, no optimizer state, no update (before DDP lists the params)
            encoder.pooler.requires_grad_(False)
        self.model = DistributedDataParallel(encoder) if self.world_size > 1 else encoder
        self.trained = [(n, p) for n, p in encoder.named_parameters() if p.requires_grad]
        attention_lr = pma_lr if cfg.pma_attention_learning_rate is None else cfg.pma_attention_learning_rate
        groups = [
            {"params": [p for p in encoder.backbone.parameters() if p.requires_grad], "lr": cfg.learning_rate},
            *head_groups(encoder.pooler, pma_lr, attention_lr),
        ]
        self.optimizer = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=cfg.weight_decay)
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None  # the loop's: it counts the run's steps
        self.step = 0  # optimizer steps taken (the loop advances it; the messages below name step + 1)
        self._tokens = 0  # real (non-padding) tokens embedded with a graph in the current step
        self._slots = 0  # token slots (real and padding) computed with a graph in the current step

    def last_good(self) -> str:
        """The last checkpoint written, for error messages (the loop writes checkpoints)."""
        return "none written yet"

    @property
    def token_budget(self) -> int:
        """Token slots (rows x longest) per micro-batch: `grad_cache_chunk` texts of `max_length`; shorter texts
        pack more rows into the same slots, so the memory of one micro-batch's graph stays the same."""
        return self.cfg.grad_cache_chunk * self.cfg.max_length

    def take_step(self, batch: dict[str, list]) -> dict[str, Any]:
        """One optimizer step on `batch` (this rank's rows of a global batch); returns what it logs: the dataset and
        language, the losses (means over ranks), learning rate, gradient norm, tokens, padding efficiency, seconds."""
        dataset, tick = batch["dataset"][0], time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        self._tokens = self._slots = 0
        out = self.forward_backward(batch)  # means over ranks, agreed finite
        norm = torch.nn.utils.clip_grad_norm_(
            [p for g in self.optimizer.param_groups for p in g["params"]], self.cfg.max_grad_norm
        )
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.check_weights(dataset)
        self.scheduler.step()
        return {
            "dataset": dataset, "language": batch["language"][0], "loss": out["loss"].item(),
            "in_batch": out["in_batch"].item(), "hard_negative": out["hard_negative"].item(), "lr": lr,
            "grad_norm": float(norm), "tokens": self._tokens, "padding_efficiency": self._tokens / max(1, self._slots),
            "seconds": time.perf_counter() - tick, **{k: v.item() for k, v in out.items() if k.startswith("loss@")},
        }  # fmt: skip

    def texts(self, batch: dict[str, list]) -> tuple[list[str], int]:
        """Formatted [queries; positives; negatives (row-major)] and the K used for this batch.

        The c2llm prompt style uses each row's own instruction (table 1) and the encoder's document prefix;
        the peer styles take both from their prompt set by the batch's dataset (one dataset per batch)."""
        enc = self.encoder
        k = min([self.cfg.num_negatives, *(len(n) for n in batch["negatives"])])
        if enc.config.prompt_style == "c2llm":
            instructions, document = batch["instruction"], None
        else:
            query, document = prompts(enc.config.prompt_style, batch["dataset"][0])
            instructions = [query] * len(batch["query"])
        queries = [enc.format_texts([q], "query", ins)[0] for q, ins in zip(batch["query"], instructions, strict=True)]
        documents = enc.format_texts(
            batch["positive"] + [n for negs in batch["negatives"] for n in negs[:k]], "document", document
        )
        return queries + documents, k

    def micro_batches(self, texts: list[str], b: int) -> list[tuple[list[int], dict[str, torch.Tensor]]]:
        """[(indices into `texts`, their left-padded tokens (m, t))]: the queries (`texts[:b]`) and the documents
        apart, each sorted by length into micro-batches of at most `token_budget` slots (rows x longest)."""
        tokens = self.encoder.tokenize_formatted(texts, self.cfg.max_length)  # (N, T), left-padded
        lengths = tokens["attention_mask"].sum(-1).tolist()  # (N,) real tokens
        width = tokens["input_ids"].shape[-1]
        out = []
        for start, stop in ((0, b), (b, len(texts))):
            for group in micro_batches(lengths[start:stop], self.token_budget):
                idx = [start + i for i in group]
                longest = max(1, max(lengths[i] for i in idx))
                rows = torch.tensor(idx)
                out.append((idx, {k: v[rows, width - longest :] for k, v in tokens.items()}))  # (m, longest)
        return out

    def embed(self, tokens: dict[str, torch.Tensor]) -> torch.Tensor:
        """Embeddings (m, d) of one micro-batch; with a graph, its real tokens and token slots are counted."""
        if torch.is_grad_enabled():  # the pass with a graph (GradCache's first pass has none)
            self._tokens += int(tokens["attention_mask"].sum())
            self._slots += tokens["attention_mask"].numel()
        return self.model(**tokens)  # (m, d)

    def loss_from(self, emb: torch.Tensor, b: int, k: int, dataset: str) -> dict[str, torch.Tensor]:
        q, p = emb[:b], emb[b : 2 * b]  # (b, d) each
        n = emb[2 * b :].view(b, k, -1) if k else None  # (b, K, d)
        cfg = self.cfg
        kwargs = {"tau": cfg.tau, "joint": cfg.joint_softmax, "gather_grad": cfg.gather_with_grad,
                  "weight": cfg.loss_weights.get(dataset, 1.0)}  # fmt: skip
        if cfg.mrl_dims:  # the full width, weight 1, then each smaller width
            dims, weights = (q.shape[-1], *cfg.mrl_dims), (1.0, *cfg.mrl_weights) if cfg.mrl_weights else None
            return matryoshka_loss(q, p, n, dims, weights, **kwargs)
        return contrastive_loss(q, p, n, **kwargs)

    def forward_backward(self, batch: dict[str, list]) -> dict[str, torch.Tensor]:
        """One step's forward and backward passes; returns the logged losses, each the mean over all ranks.
        A non-finite loss on any rank raises on every rank before any backward pass."""
        texts, k = self.texts(batch)
        b, dataset = len(batch["query"]), batch["dataset"][0]
        plan = self.micro_batches(texts, b)
        order = torch.tensor([i for idx, _ in plan for i in idx])  # micro-batch row -> text
        back = torch.empty_like(order)
        back[order] = torch.arange(len(order))  # text -> micro-batch row
        if not self.cfg.grad_cache:
            emb = torch.cat([self.embed(tokens) for _, tokens in plan])[back]  # (N, d), in text order
            out = self.loss_from(emb, b, k, dataset)
            logged = self.agree_finite(out, dataset)
            out["loss"].backward()
            return logged
        states, parts = [], []
        with torch.no_grad():
            for _, tokens in plan:
                states.append(rng_state())
                parts.append(self.embed(tokens))
        cached = torch.cat(parts)[back].detach().requires_grad_()  # (N, d), in text order
        out = self.loss_from(cached, b, k, dataset)
        logged = self.agree_finite(out, dataset)
        out["loss"].backward()
        grads = cached.grad[order].split([len(idx) for idx, _ in plan])  # (m, d) per micro-batch
        for i, ((_, tokens), state, grad) in enumerate(zip(plan, states, grads, strict=True)):
            last = i == len(plan) - 1
            sync = (
                self.model.no_sync()
                if isinstance(self.model, DistributedDataParallel) and not last
                else contextlib.nullcontext()
            )
            with sync:
                set_rng_state(state)  # the same dropout masks as in the graph-free pass
                self.embed(tokens).backward(grad)
        return logged

    def agree_finite(self, out: dict[str, torch.Tensor], dataset: str) -> dict[str, torch.Tensor]:
        """Every rank's losses, gathered before the backward pass (whose all-reduce would wait forever for a rank
        that stopped): any non-finite value stops every rank with the same message. Returns the means over ranks."""
        keys = ["loss", "in_batch", "hard_negative", *sorted(k for k in out if k.startswith("loss@"))]
        local = torch.stack([out[k].detach().float().reshape(()) for k in keys])  # (L,)
        every = gather_without_grad(local[None])  # (W, L), rank order
        bad = [r for r in range(every.shape[0]) if not torch.isfinite(every[r]).all()]
        if bad:
            where = f" on rank {', '.join(map(str, bad))} of {self.world_size}" if self.world_size > 1 else ""
            raise NonFiniteLoss(
                f"the loss is {every[bad[0], 0].item()} at step {self.step + 1} (dataset {dataset}){where}; stopping "
                f"before the update. The last good checkpoint is {self.last_good()}"
            )
        mean = every.mean(0)  # (L,)
        return {key: mean[i] for i, key in enumerate(keys)}

    def check_weights(self, dataset: str) -> None:
        """After an update: every trainable weight finite on every rank, or the run stops before checkpointing."""
        finite = torch.stack([torch.isfinite(p).all() for _, p in self.trained]).all()
        if all_ranks_true(finite):
            return
        bad = [n for n, p in self.trained if not torch.isfinite(p).all()]
        raise NonFiniteWeights(
            f"the update at step {self.step + 1} (dataset {dataset}) made trainable weights non-finite "
            f"({len(bad)} tensors, e.g. {bad[:3]}); stopping before it is checkpointed (check learning_rate and "
            f"max_grad_norm). The last good checkpoint is {self.last_good()}"
        )


class Trainer(TrainStep):
    """Trains `encoder` (with LoRA) on `rows` (a datasets.Dataset of unified records): the loop over the sampler's
    global batches (`TrainStep.take_step` for each), the step metrics, checkpoints, and resuming."""

    def __init__(self, encoder: C2LLMEncoder, rows, cfg: TrainConfig, checkpoint_root: str | Path | None = None):
        super().__init__(encoder, cfg)
        self.rows = rows
        self.checkpoint_root = Path(checkpoint_root) if checkpoint_root is not None else None
        torch.manual_seed(cfg.seed)
        self.sampler = GroupedBatchSampler(
            list(zip(rows["dataset"], rows["language"], strict=True)),
            [text_key(t) for t in rows["query"]],
            [text_key(t) for t in rows["positive"]],
            cfg.global_batch_size,
            self.world_size,
            self.rank,
            cfg.seed,
        )
        steps_per_epoch = len(self.sampler)
        if steps_per_epoch == 0:
            raise ValueError(
                f"no global batch of {cfg.global_batch_size} rows can be formed: every (dataset, language) group "
                "is smaller; lower global_batch_size"
            )
        self.total_steps = min(cfg.max_steps or steps_per_epoch * cfg.epochs, steps_per_epoch * cfg.epochs)
        self.checkpoint_steps = checkpoint_schedule(cfg, self.total_steps)
        if self.checkpoint_steps and self.checkpoint_root is None:
            raise ValueError("checkpoint_steps or checkpoint_fractions are set but no checkpoint_root was given")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(cfg.warmup_steps, self.total_steps, cfg.min_lr_ratio, cfg.lr_schedule)
        )
        self.metrics: list[dict[str, Any]] = []
        self.checkpoints: list[str] = []

    @functools.cached_property
    def data_fingerprint(self) -> str:
        return data_fingerprint(self.rows)

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must share with this trainer to be resumed by it (`training_identity`)."""
        return training_identity(self.encoder.config, self.cfg, self.data_fingerprint, self.world_size)

    def last_good(self) -> str:
        return self.checkpoints[-1] if self.checkpoints else "none written yet"

    # the loop ------------------------------------------------------------------------------------
    def train(self, on_step: Callable[[dict[str, Any]], None] | None = None, progress: bool = True) -> TrainResult:
        """Optimizer steps until `total_steps`, checkpointing at `checkpoint_steps`; `on_step(metrics)` after each
        step (and its checkpoint), on every rank. `progress`: rank 0's progress bar."""
        start = time.perf_counter()
        self.encoder.train()
        bar = tqdm(total=self.total_steps, initial=self.step, disable=self.rank != 0 or not progress, desc="train")
        while self.step < self.total_steps:
            for indices in self.sampler:
                batch = self.rows[indices]
                logged = self.take_step(batch)
                self.step += 1
                self.metrics.append({"step": self.step, "epoch": self.sampler.epoch, **logged})
                bar.update(1)
                bar.set_postfix(loss=f"{logged['loss']:.3f}", data=logged["dataset"][:20])
                if self.step in self.checkpoint_steps:
                    self.save(self.step)
                if on_step is not None:
                    on_step(self.metrics[-1])
                if self.step >= self.total_steps:
                    break
            else:
                self.sampler.set_epoch(self.sampler.epoch + 1)
        bar.close()
        return TrainResult(self.step, self.metrics, self.checkpoints, time.perf_counter() - start)

    def save_final(self) -> str:
        """A checkpoint of the last step, unless one was just written; returns its path."""
        name = f"step-{self.step:06d}"
        if not self.checkpoints or not self.checkpoints[-1].endswith(name):
            self.save(self.step)
        return self.checkpoints[-1]

    def save(self, step: int) -> None:
        path = self.checkpoint_root / f"step-{step:06d}"
        self.checkpoints.append(str(path))  # before the state is taken, so a resumed run lists it too
        rngs = all_gather_json(rng_to_json(rng_state()))  # every rank's own RNG, rank order
        if self.rank == 0:
            save_checkpoint(path, self.encoder, self.state(rngs))
        barrier()

    # resuming ------------------------------------------------------------------------------------
    def state(self, rngs: list[dict[str, Any]]) -> TrainerState:
        """(JSON part, optimizer tensors) of the trainer; `rngs`: every rank's `rng_to_json`, in rank order."""
        optimizer, tensors = optimizer_to_state(self.optimizer.state_dict())
        values = {
            "step": self.step,
            "training": self.identity(),
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": rngs,
            "metrics": self.metrics,
            "checkpoints": self.checkpoints,
        }
        return values, tensors

    def resume(self, checkpoint: str | Path) -> None:
        """Continues from a checkpoint written by this trainer: the same model and training configs, rows and
        world size (anything else is refused, naming what differs); each rank takes back its own RNG state."""
        self.restore(read_checkpoint(checkpoint))

    def restore(self, checkpoint: Checkpoint) -> None:
        state, source = checkpoint.state, checkpoint.path / STATE_JSON
        differ = identity_differences(state["training"], self.identity()) if isinstance(state["training"], dict) else [
            "the checkpoint records no training identity"]  # fmt: skip
        if differ:
            raise CheckpointMismatch(
                f"{checkpoint.path} was written by another training; it differs from this run in "
                + "; ".join(differ)
                + ". Resume only with the configuration, rows and number of processes that wrote it"
            )
        if not isinstance(state["rng"], list) or len(state["rng"]) != self.world_size:
            raise CorruptFile(f"{source}: expected the RNG states of {self.world_size} rank(s)")
        rng = rng_from_json(state["rng"][self.rank], source)
        optimizer = optimizer_from_state(state["optimizer"], checkpoint.state_tensors, source)
        for saved, current in zip(optimizer["param_groups"], self.optimizer.param_groups, strict=False):
            saved.update({k: tuple(v) for k, v in saved.items() if isinstance(current.get(k), tuple)})  # betas
        apply_weights(checkpoint, self.encoder)
        try:
            self.optimizer.load_state_dict(optimizer)
            self.scheduler.load_state_dict(state["scheduler"])
            self.sampler.load_state_dict(state["sampler"])
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptFile(f"{source}: the saved trainer state does not fit ({type(err).__name__}: {err})") from None
        self.step, self.metrics, self.checkpoints = int(state["step"]), state["metrics"], list(state["checkpoints"])
        if self.checkpoint_root is not None:  # where they are now (a run directory may have moved)
            self.checkpoints = [str(self.checkpoint_root / Path(c).name) for c in self.checkpoints]
        set_rng_state(rng)

    def resume_latest(self) -> str:
        """What notebook 02 does before training, in its checkpoint folder; returns a sentence saying what it did.

        - empty: trains from step 0;
        - checkpoints of this same training (identity recorded in each): resumes from the last complete one; a
          later incomplete or corrupt one is named and moved to `<folder>.corrupt-<time>/`;
        - anything else (another model or training config, other rows, an older format): the whole folder is
          moved to `<folder>.replaced-<time>/`, never deleted, and training starts from step 0."""
        root = self.checkpoint_root
        if root is None:
            raise ValueError("resume_latest needs the checkpoint_root this trainer writes to")
        if not root.is_dir() or not any(root.iterdir()):
            return f"{root} holds no checkpoint: training from step 0"
        found = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))
        ours, foreign, recorded = self.identity(), [], 0
        for path in found:
            try:
                saved = load_json(path / STATE_JSON, "trainer state")["training"]
                differ = identity_differences(saved, ours)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # unreadable: judged below, as incomplete
            recorded += 1
            if differ:
                foreign.append((path, differ))
        resume_from, notes, corrupt = None, [], []
        if not foreign and recorded:
            for path in reversed(found):
                try:
                    resume_from = read_checkpoint(path)
                    break
                except (OSError, ValueError) as err:
                    notes.append(f"{path.name} is incomplete or corrupt ({err}); falling back to the previous one.")
                    corrupt.append(path)
        barrier()  # every rank has read the folder before rank 0 moves anything
        if resume_from is None:
            if foreign:
                path, differ = foreign[0]
                why = f"{path.name} was trained with a different setup ({'; '.join(differ[:3])})"
            elif recorded:
                why = "none of its checkpoints is complete"
            else:
                why = "nothing in it records which training wrote it (another format, or no checkpoint)"
            moved = move_aside(root, "replaced") if self.rank == 0 else root
            if self.rank == 0:
                root.mkdir()
            barrier()
            return " ".join([*notes, f"{root} held no resumable checkpoint of this training: {why}. Moved it to "
                             f"{moved} (nothing deleted); training from step 0"])  # fmt: skip
        if corrupt and self.rank == 0:
            aside = root.with_name(f"{root.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            aside.mkdir(exist_ok=True)
            for path in corrupt:
                os.replace(path, aside / path.name)
            notes.append(f"Moved {[p.name for p in corrupt]} to {aside}.")
        barrier()
        self.restore(resume_from)
        return " ".join([*notes, f"Resuming this training from {resume_from.path} (step {self.step} of "
                         f"{self.total_steps})"])  # fmt: skip


def reset_peak_memory() -> None:
    """Starts a new peak-memory window (after the model is loaded, so that the peak is the training's): Linux's
    resident peak (VmHWM, reset through /proc/self/clear_refs) and CUDA's allocator peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # not Linux, or not allowed: only the whole-process peak is reported
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def peak_memory() -> dict[str, float]:
    """Peak memory in GB: `peak_rss_gb` of the whole process (loading the weights included), `train_peak_rss_gb`
    since `reset_peak_memory` (Linux), and `peak_cuda_gb` allocated since then when a GPU is in use."""
    import resource

    from .memory import high_water_kib

    out = {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}  # ru_maxrss is in KiB on Linux
    window = high_water_kib()  # None off Linux
    if window is not None:  # the kernel's two counters update at different moments; the whole includes the window
        out["train_peak_rss_gb"] = window / 2**20
        out["peak_rss_gb"] = max(out["peak_rss_gb"], out["train_peak_rss_gb"])
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["peak_cuda_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def throughput(metrics: list[dict[str, Any]]) -> dict[str, float]:
    """Steps, step seconds, real tokens embedded with a graph, tokens per second, and the padding efficiency (real
    tokens / computed token slots, over the steps that record it), from the step metrics."""
    seconds = sum(m["seconds"] for m in metrics)
    tokens = sum(m["tokens"] for m in metrics)
    out = {
        "steps": len(metrics),
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_second": tokens / max(seconds, 1e-9),
    }
    recorded = [m for m in metrics if m.get("padding_efficiency")]
    if recorded:
        slots = sum(m["tokens"] / m["padding_efficiency"] for m in recorded)
        out["padding_efficiency"] = sum(m["tokens"] for m in recorded) / slots
    return out


def split_params(params: dict[str, Any], source: str) -> tuple[ModelConfig, TrainConfig]:
    """A flat params mapping -> (ModelConfig, TrainConfig); a key of neither is an error naming it. The launch keys
    of notebook 02 (`LaunchConfig`: nproc, nnodes, ...) are validated and set aside: they say how many processes
    train, not what is trained."""
    import dataclasses

    model_keys = {f.name for f in dataclasses.fields(ModelConfig)}
    train_keys = {f.name for f in dataclasses.fields(TrainConfig)}
    launch_keys = {f.name for f in dataclasses.fields(LaunchConfig)}
    unknown = sorted(set(params) - model_keys - train_keys - launch_keys)
    if unknown:
        raise ConfigError(f"{source}: unknown parameter(s) {unknown} (neither a model nor a training parameter)")
    from_dict(LaunchConfig, {k: v for k, v in params.items() if k in launch_keys}, source)
    model = from_dict(ModelConfig, {k: v for k, v in params.items() if k in model_keys}, source)
    train = from_dict(TrainConfig, {k: v for k, v in params.items() if k in train_keys}, source)
    return model, train


FAULT_RANK = "C2LLM_FAULT_RANK"  # fault injection for tests: this global rank fails after its first step...
FAULT_MODE = "C2LLM_FAULT"  # ...raising ("raise", the default), or exiting at once with status 3 ("exit")


def injected_fault(rank: int) -> Callable[[dict[str, Any]], None]:
    """A step callback that makes this rank fail after step 1 when `C2LLM_FAULT_RANK` names it (tests of how a dead
    rank is reported); a no-op otherwise."""

    def fault(metrics: dict[str, Any]) -> None:
        if os.environ.get(FAULT_RANK) != str(rank) or metrics["step"] != 1:
            return
        if os.environ.get(FAULT_MODE, "raise") == "exit":
            print(f"rank {rank}: injected fault, exiting with status 3", file=sys.stderr, flush=True)
            os._exit(3)
        raise RuntimeError(f"injected fault on rank {rank} after step 1 ({FAULT_RANK})")

    return fault


def main(argv: list[str] | None = None) -> None:
    """torchrun [--nproc_per_node N] -m c2llm_lib.train --params P --rows DATA --out CKPTS
                [--resume CKPT | --resume-latest] [--record-dir DIR]

    Writes the checkpoints into CKPTS, and rank 0 writes into DIR (default CKPTS): `steps.jsonl` while it trains
    (a first line with the total steps, the step it starts from and what resuming did, then each step's metrics),
    then `train_metrics.json` (one entry per step) and `train_summary.json` (throughput, rank 0's peak memory, the
    checkpoints and what identifies the training). `--resume-latest` does what notebook 02 does in its kernel
    (`Trainer.resume_latest`). Every rank must train the same thing (configs, rows): a rank that differs from rank
    0 is an error naming it."""
    import argparse

    import yaml
    from datasets import load_from_disk

    from .distributed import init_distributed

    parser = argparse.ArgumentParser(description="Contrastive LoRA training of a C2LLM encoder (paper section 4.1)")
    parser.add_argument("--params", required=True, help="flat YAML of model and training parameters")
    parser.add_argument("--rows", required=True, help="a prepared dataset (datasets.save_to_disk folder)")
    parser.add_argument("--out", required=True, help="folder for the checkpoints (must be new unless resuming)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resume", default=None, help="a checkpoint folder to continue from")
    group.add_argument("--resume-latest", action="store_true",
                       help="as notebook 02: resume this training's last complete checkpoint in --out, or move "
                       "another training's checkpoints aside and start at step 0")  # fmt: skip
    parser.add_argument("--record-dir", default=None,
                        help="where rank 0 writes its step log and summary (default: --out)")  # fmt: skip
    args = parser.parse_args(argv)
    with open(args.params) as fh:
        params = yaml.safe_load(fh) or {}
    model_cfg, train_cfg = split_params(params, args.params)
    out = Path(args.out)
    logs = Path(args.record_dir) if args.record_dir else out
    if out.exists() and any(out.iterdir()) and args.resume is None and not args.resume_latest:
        raise SystemExit(f"{out} already holds checkpoints; pass --resume CHECKPOINT or choose a new --out")
    if not model_cfg.use_lora:
        raise SystemExit(f"{args.params}: training needs use_lora: true")
    rank, world_size = init_distributed()
    if model_cfg.device in ("auto", "cuda") and torch.cuda.is_available():  # each process on its own GPU
        model_cfg.device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    torch.manual_seed(train_cfg.seed)
    encoder = C2LLMEncoder.from_config(model_cfg)
    trainable = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    trainer = Trainer(encoder, load_from_disk(args.rows), train_cfg, out)
    identities = all_gather_json(trainer.identity())
    differ = [r for r, theirs in enumerate(identities) if theirs != identities[0]]
    if differ:
        keys = sorted({k for r in differ for k in identities[r] if identities[r][k] != identities[0][k]})
        raise ValueError(f"rank(s) {differ} would train something else than rank 0 (their {', '.join(keys)} "
                         "differ): every machine needs the same params and the same prepared rows")  # fmt: skip
    note = f"Resuming from {args.resume}" if args.resume else "training from step 0"
    if args.resume:
        trainer.resume(args.resume)
    elif args.resume_latest:
        note = trainer.resume_latest()
    steps_log = logs / "steps.jsonl"
    if rank == 0:
        logs.mkdir(parents=True, exist_ok=True)
        header = {"total_steps": trainer.total_steps, "step": trainer.step, "world_size": world_size, "note": note}
        steps_log.write_text(json.dumps(header) + "\n")
    fault = injected_fault(rank)

    def on_step(metrics: dict[str, Any]) -> None:
        if rank == 0:
            with steps_log.open("a") as fh:
                fh.write(json.dumps(metrics) + "\n")
        fault(metrics)

    reset_peak_memory()
    result = trainer.train(on_step=on_step)
    trainer.save_final()
    if rank == 0:
        (logs / "train_metrics.json").write_text(json.dumps(trainer.metrics, indent=1) + "\n")
        summary = {**throughput(trainer.metrics), **peak_memory(), "world_size": world_size,
                   "final_checkpoint": trainer.checkpoints[-1], "checkpoints": trainer.checkpoints,
                   "checkpoint_steps": trainer.checkpoint_steps, "total_steps": trainer.total_steps,
                   "train_seconds": result.seconds, "data_fingerprint": trainer.data_fingerprint,
                   "trainable_parameters": trainable, "note": note}  # fmt: skip
        (logs / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(
            f"trained {result.steps} steps on {world_size} process(es) in {result.seconds:.1f}s; checkpoints in {out}"
        )
    if world_size > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    record(main)()  # under torchrun, a rank's exception (message and traceback) goes to its error file
