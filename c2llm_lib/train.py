"""Contrastive LoRA training (paper section 4.1), on torchrun + DDP or a single process.

One optimizer step = one global batch from one (dataset, language) group (`samplers.py`): each rank
embeds its slice of queries (with the row's instruction, or the prompt set of the encoder's
`prompt_style`), positives and K hard negatives (with the document prefix) in one forward pass, and
`losses.contrastive_loss` scores local queries against the whole global batch (with `mrl_dims`,
`losses.matryoshka_loss`: the same loss also on the first d coordinates for each d). The LoRA adapters and
the PMA head train (the head may have its own learning rate), with AdamW, linear warmup then a cosine (or
linear) decay counted in *optimizer steps* (the scheduler is stepped once per step on every rank, never once
per process), and gradient clipping.

GradCache (`grad_cache=True`): embed all texts in chunks without a graph, compute the loss and its
gradient with respect to the embeddings, then re-embed chunk by chunk with a graph and backpropagate
the cached gradients. Memory then depends on the chunk, not the global batch, and the loss and
gradients are those of the plain step (tested).

Checkpoints are written at the configured global steps, atomically (a staging folder renamed into
place): the LoRA adapter and PMA head in safetensors, and the optimizer, scheduler, sampler and RNG
states, so that a killed run resumed from its last checkpoint ends with the same weights as an
uninterrupted one (tested). A non-finite loss stops the run with a message naming the step and
dataset, before any update or checkpoint, so the last good checkpoint stays intact.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from .atomic import atomic_directory
from .config import ModelConfig, TrainConfig, from_dict
from .data.records import text_key
from .distributed import world
from .losses import contrastive_loss, matryoshka_loss
from .model import C2LLMEncoder
from .prompts import prompts
from .samplers import GroupedBatchSampler


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite; the run stopped before updating anything."""


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


def save_checkpoint(directory: Path, encoder: C2LLMEncoder, trainer_state: dict[str, Any] | None = None) -> Path:
    """Adapter + PMA head (safetensors) + the model config [+ trainer state], written atomically."""
    if encoder.base_model is encoder.backbone:
        raise ValueError("checkpoints hold a LoRA adapter; this encoder has none (use_lora=False)")
    with atomic_directory(directory) as staging:
        encoder.backbone.save_pretrained(staging / "adapter")
        pooler = {k: v.detach().contiguous().cpu() for k, v in encoder.pooler.state_dict().items()}
        save_file(pooler, staging / "pooler.safetensors", metadata={"format": "pt"})
        (staging / "model_config.json").write_text(json.dumps(encoder.config.to_dict(), indent=2) + "\n")
        if trainer_state is not None:
            torch.save(trainer_state, staging / "trainer_state.pt")
    return Path(directory)


def load_checkpoint_weights(directory: Path, encoder: C2LLMEncoder) -> None:
    """Loads a checkpoint's adapter and PMA head into an encoder built with the same ModelConfig."""
    from peft import set_peft_model_state_dict

    directory = Path(directory)
    if not (directory / "adapter").is_dir():
        raise FileNotFoundError(f"{directory} is not a training checkpoint (no adapter/ folder)")
    result = set_peft_model_state_dict(encoder.backbone, load_file(directory / "adapter" / "adapter_model.safetensors"))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"{directory}: adapter weights do not fit this encoder: {unexpected[:5]}")
    encoder.pooler.load_state_dict(load_file(directory / "pooler.safetensors"))


def encoder_from_checkpoint(directory: Path, device: str | None = None) -> C2LLMEncoder:
    """A fresh encoder (base backbone as configured) carrying the checkpoint's adapter and head."""
    cfg = from_dict(ModelConfig, json.loads((Path(directory) / "model_config.json").read_text()), str(directory))
    if device:
        cfg.device = device
    encoder = C2LLMEncoder.from_config(cfg)
    load_checkpoint_weights(directory, encoder)
    return encoder


@dataclass
class TrainResult:
    steps: int
    metrics: list[dict[str, Any]]
    checkpoints: list[str]
    seconds: float


class Trainer:
    """Trains `encoder` (with LoRA) on `rows` (a datasets.Dataset of unified records)."""

    def __init__(self, encoder: C2LLMEncoder, rows, cfg: TrainConfig, checkpoint_root: str | Path | None = None):
        if encoder.base_model is encoder.backbone:
            raise ValueError("training needs LoRA: build the encoder with use_lora=True")
        too_wide = [d for d in cfg.mrl_dims if d >= encoder.embedding_dim]
        if too_wide:
            raise ValueError(
                f"mrl_dims {too_wide} are not below the embedding width {encoder.embedding_dim} (the full width "
                "is always trained; list only the smaller widths)"
            )
        self.encoder, self.rows, self.cfg = encoder, rows, cfg
        self.checkpoint_root = Path(checkpoint_root) if checkpoint_root is not None else None
        if cfg.checkpoint_steps and self.checkpoint_root is None:
            raise ValueError("checkpoint_steps are set but no checkpoint_root was given")
        self.rank, self.world_size = world()
        self.model = DistributedDataParallel(encoder) if self.world_size > 1 else encoder
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
        pma_lr = cfg.pma_learning_rate or cfg.learning_rate
        groups = [
            {"params": [p for p in encoder.backbone.parameters() if p.requires_grad], "lr": cfg.learning_rate},
            {"params": list(encoder.pooler.parameters()), "lr": pma_lr},
        ]
        self.optimizer = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(cfg.warmup_steps, self.total_steps, cfg.min_lr_ratio, cfg.lr_schedule)
        )
        self.step = 0
        self._tokens = 0  # real (non-padding) tokens embedded with a graph in the current step
        self.metrics: list[dict[str, Any]] = []
        self.checkpoints: list[str] = []

    # one step ------------------------------------------------------------------------------------
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

    def embed(self, texts: list[str]) -> torch.Tensor:
        batch = self.encoder.tokenize_formatted(texts, self.cfg.max_length)
        if torch.is_grad_enabled():  # the pass with a graph (GradCache's first pass has none)
            self._tokens += int(batch["attention_mask"].sum())
        return self.model(**batch)  # (N, d)

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
        texts, k = self.texts(batch)
        b, dataset = len(batch["query"]), batch["dataset"][0]
        if not self.cfg.grad_cache:
            out = self.loss_from(self.embed(texts), b, k, dataset)
            self.check_finite(out["loss"], dataset)
            out["loss"].backward()
            return out
        chunks = [texts[i : i + self.cfg.grad_cache_chunk] for i in range(0, len(texts), self.cfg.grad_cache_chunk)]
        states, parts = [], []
        with torch.no_grad():
            for chunk in chunks:
                states.append(rng_state())
                parts.append(self.embed(chunk))
        cached = torch.cat(parts).detach().requires_grad_()  # (N, d)
        out = self.loss_from(cached, b, k, dataset)
        self.check_finite(out["loss"], dataset)
        out["loss"].backward()
        grads = cached.grad.split([len(c) for c in chunks])
        for i, (chunk, state, grad) in enumerate(zip(chunks, states, grads, strict=True)):
            last = i == len(chunks) - 1
            sync = (
                self.model.no_sync()
                if isinstance(self.model, DistributedDataParallel) and not last
                else contextlib.nullcontext()
            )
            with sync:
                set_rng_state(state)  # the same dropout masks as in the graph-free pass
                self.embed(chunk).backward(grad)
        return {key: value.detach() for key, value in out.items()}

    def check_finite(self, loss: torch.Tensor, dataset: str) -> None:
        if not torch.isfinite(loss):
            last = self.checkpoints[-1] if self.checkpoints else "none written yet"
            raise NonFiniteLoss(
                f"the loss is {loss.item()} at step {self.step + 1} (dataset {dataset}); stopping before the update. "
                f"The last good checkpoint is {last}"
            )

    # the loop ------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(),
            "metrics": self.metrics,
            "checkpoints": self.checkpoints,
        }

    def resume(self, checkpoint: str | Path) -> None:
        """Continues from a checkpoint written by this trainer (same data, config and world size)."""
        checkpoint = Path(checkpoint)
        state_file = checkpoint / "trainer_state.pt"
        if not state_file.is_file():
            raise FileNotFoundError(f"{state_file} not found: cannot resume from {checkpoint}")
        load_checkpoint_weights(checkpoint, self.encoder)
        state = torch.load(state_file, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.step, self.metrics, self.checkpoints = state["step"], state["metrics"], state["checkpoints"]
        set_rng_state(state["rng"])

    def train(self) -> TrainResult:
        start = time.perf_counter()
        self.encoder.train()
        bar = tqdm(total=self.total_steps, initial=self.step, disable=self.rank != 0, desc="train")
        while self.step < self.total_steps:
            for indices in self.sampler:
                batch = self.rows[indices]
                tick = time.perf_counter()
                self.optimizer.zero_grad(set_to_none=True)
                self._tokens = 0
                out = self.forward_backward(batch)
                norm = torch.nn.utils.clip_grad_norm_(
                    [p for g in self.optimizer.param_groups for p in g["params"]], self.cfg.max_grad_norm
                )
                lr = self.optimizer.param_groups[0]["lr"]
                self.optimizer.step()
                self.scheduler.step()
                self.step += 1
                self.metrics.append({
                    "step": self.step, "epoch": self.sampler.epoch, "dataset": batch["dataset"][0],
                    "language": batch["language"][0], "loss": out["loss"].item(), "in_batch": out["in_batch"].item(),
                    "hard_negative": float(out["hard_negative"].detach()), "lr": lr, "grad_norm": float(norm),
                    "tokens": self._tokens, "seconds": time.perf_counter() - tick,
                    **{key: float(v.detach()) for key, v in out.items() if key.startswith("loss@")},
                })  # fmt: skip
                bar.update(1)
                bar.set_postfix(loss=f"{out['loss'].item():.3f}", data=batch["dataset"][0][:20])
                if self.step in self.cfg.checkpoint_steps:
                    self.save(self.step)
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
        if self.rank == 0:
            save_checkpoint(path, self.encoder, self.state())
        if self.world_size > 1:
            torch.distributed.barrier()


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
    import re
    import resource

    out = {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}  # ru_maxrss is in KiB on Linux
    try:
        found = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
        if found:  # the kernel's two counters update at different moments; the whole includes the window
            out["train_peak_rss_gb"] = int(found.group(1)) / 2**20
            out["peak_rss_gb"] = max(out["peak_rss_gb"], out["train_peak_rss_gb"])
    except OSError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["peak_cuda_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def throughput(metrics: list[dict[str, Any]]) -> dict[str, float]:
    """Steps, step seconds, real tokens embedded with a graph, and tokens per second, from the step metrics."""
    seconds = sum(m["seconds"] for m in metrics)
    tokens = sum(m["tokens"] for m in metrics)
    return {
        "steps": len(metrics),
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_second": tokens / max(seconds, 1e-9),
    }


def split_params(params: dict[str, Any], source: str) -> tuple[ModelConfig, TrainConfig]:
    """A flat params mapping -> (ModelConfig, TrainConfig); a key of neither is an error naming it."""
    import dataclasses

    model_keys = {f.name for f in dataclasses.fields(ModelConfig)}
    train_keys = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(params) - model_keys - train_keys)
    if unknown:
        from .config import ConfigError

        raise ConfigError(f"{source}: unknown parameter(s) {unknown} (neither a model nor a training parameter)")
    model = from_dict(ModelConfig, {k: v for k, v in params.items() if k in model_keys}, source)
    train = from_dict(TrainConfig, {k: v for k, v in params.items() if k in train_keys}, source)
    return model, train


def main(argv: list[str] | None = None) -> None:
    """torchrun [--nproc_per_node N] -m c2llm_lib.train --params P --rows DATA --out CKPTS [--resume CKPT]

    Writes the checkpoints, `train_metrics.json` (one entry per step) and `train_summary.json` (throughput and
    rank 0's peak memory) into CKPTS."""
    import argparse

    import yaml
    from datasets import load_from_disk

    from .distributed import init_distributed

    parser = argparse.ArgumentParser(description="Contrastive LoRA training of a C2LLM encoder (paper section 4.1)")
    parser.add_argument("--params", required=True, help="flat YAML of model and training parameters")
    parser.add_argument("--rows", required=True, help="a prepared dataset (datasets.save_to_disk folder)")
    parser.add_argument("--out", required=True, help="folder for the checkpoints (must be new unless resuming)")
    parser.add_argument("--resume", default=None, help="a checkpoint folder to continue from")
    args = parser.parse_args(argv)
    with open(args.params) as fh:
        params = yaml.safe_load(fh) or {}
    model_cfg, train_cfg = split_params(params, args.params)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and args.resume is None:
        raise SystemExit(f"{out} already holds checkpoints; pass --resume CHECKPOINT or choose a new --out")
    if not model_cfg.use_lora:
        raise SystemExit(f"{args.params}: training needs use_lora: true")
    rank, world_size = init_distributed()
    if model_cfg.device == "auto" and torch.cuda.is_available():
        model_cfg.device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    torch.manual_seed(train_cfg.seed)
    encoder = C2LLMEncoder.from_config(model_cfg)
    trainer = Trainer(encoder, load_from_disk(args.rows), train_cfg, out)
    if args.resume:
        trainer.resume(args.resume)
    reset_peak_memory()
    result = trainer.train()
    trainer.save_final()
    if rank == 0:
        (out / "train_metrics.json").write_text(json.dumps(trainer.metrics, indent=1) + "\n")
        summary = {**throughput(trainer.metrics), **peak_memory(), "world_size": world_size,
                   "final_checkpoint": trainer.checkpoints[-1]}  # fmt: skip
        (out / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(
            f"trained {result.steps} steps on {world_size} process(es) in {result.seconds:.1f}s; checkpoints in {out}"
        )
    if world_size > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
