"""One optimizer step of contrastive LoRA training (paper section 4.1), in length-sorted micro-batches (GradCache
optional); a non-finite loss or weight stops every rank. See docs/training.md#the-trainer.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from ..batching import micro_batches
from ..config import TrainConfig
from ..distributed import all_ranks_true, gather_without_grad, world
from ..losses import contrastive_loss, matryoshka_loss
from ..model import C2LLMEncoder
from ..prompts import prompts
from .state import rng_state, set_rng_state


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite on some rank; every rank stopped before updating anything."""


class NonFiniteWeights(RuntimeError):
    """An update made a trainable weight NaN or infinite; the run stopped before checkpointing it."""


class NonFiniteGradients(NonFiniteWeights):
    """A finite loss whose backward pass gave NaN or infinite gradients; the run stopped before the update."""


def head_groups(pooler: torch.nn.Module, lr: float, attention_lr: float) -> list[dict[str, Any]]:
    """The pooler's optimizer groups: parameters at `lr`, a PMA head's attention ones at `attention_lr` when it
    differs."""
    attention = getattr(pooler, "attention_parameters", list)() if attention_lr != lr else []  # [] for other poolers
    split = {id(p) for p in attention}
    return [
        {"params": [p for p in pooler.parameters() if p.requires_grad and id(p) not in split], "lr": lr},
        {"params": [p for p in attention if p.requires_grad], "lr": attention_lr},
    ]


class TrainStep:
    """One optimizer step on one global batch; a `Trainer` holds one and loops around it."""

    def __init__(
        self, encoder: C2LLMEncoder, cfg: TrainConfig, last_good: Callable[[], str] = lambda: "none written yet"
    ):
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
        # no collective in a forward: the ranks' micro-batch counts differ; the only buffers (rotary frequencies)
        # are computed from the config, equal on every rank
        self.model = DistributedDataParallel(encoder, broadcast_buffers=False) if self.world_size > 1 else encoder
        self.k = cfg.num_negatives  # K, hard negatives per row; the loop lowers it to what the rows hold at most
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
        self._forwards = 0  # micro-batches embedded with a graph in the current step (this rank's)
        self.last_good = last_good  # the last checkpoint written, for error messages (the loop writes them)

    @property
    def token_budget(self) -> int:
        """Token slots (rows x longest) per micro-batch: `grad_cache_chunk` texts of `max_length`."""
        return self.cfg.grad_cache_chunk * self.cfg.max_length

    def take_step(self, batch: dict[str, list]) -> dict[str, Any]:
        """One optimizer step on this rank's rows of a global batch; returns its logged metrics."""
        dataset, tick = batch["dataset"][0], time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        self._tokens = self._slots = self._forwards = 0
        out = self.forward_backward(batch)  # means over ranks, agreed finite
        norm = torch.nn.utils.clip_grad_norm_(
            [p for g in self.optimizer.param_groups for p in g["params"]], self.cfg.max_grad_norm
        )
        if not torch.isfinite(norm):  # the same on every rank: DDP's all-reduce made the gradients equal
            self.refuse_gradients(dataset)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.check_weights(dataset)
        self.scheduler.step()
        return {
            "dataset": dataset, "language": batch["language"][0], "loss": out["loss"].item(),
            "in_batch": out["in_batch"].item(), "hard_negative": out["hard_negative"].item(),
            "short_of_k": round(out["short_of_k"].item()), "lr": lr, "grad_norm": float(norm),
            "tokens": self._tokens, "padding_efficiency": self._tokens / max(1, self._slots),
            "forwards": self._forwards,
            "seconds": time.perf_counter() - tick, **{k: v.item() for k, v in out.items() if k.startswith("loss@")},
        }  # fmt: skip

    def texts(self, batch: dict[str, list]) -> tuple[list[str], torch.Tensor]:
        """Formatted [queries; positives; negatives (row-major, first K)] and mask (b, K), True where a slot holds
        one."""
        enc, k = self.encoder, self.k
        if enc.config.prompt_style == "c2llm":
            instructions, document = batch["instruction"], None
        else:
            query, document = prompts(enc.config.prompt_style, batch["dataset"][0])
            instructions = [query] * len(batch["query"])
        queries = [enc.format_texts([q], "query", ins)[0] for q, ins in zip(batch["query"], instructions, strict=True)]
        negatives = [negs[:k] for negs in batch["negatives"]]
        mask = torch.tensor([[j < len(negs) for j in range(k)] for negs in negatives], dtype=torch.bool)  # (b, K)
        documents = enc.format_texts(batch["positive"] + [n for negs in negatives for n in negs], "document", document)
        return queries + documents, mask.reshape(len(negatives), k)

    def micro_batches(self, texts: list[str], b: int) -> list[tuple[list[int], dict[str, torch.Tensor]]]:
        """[(indices into `texts`, tokens (m, t))]: queries (`texts[:b]`) and documents apart, `token_budget` slots
        each."""
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
        """Embeddings (m, d) of one micro-batch; with a graph, its real tokens, token slots and forward are counted."""
        if torch.is_grad_enabled():  # the pass with a graph (GradCache's first pass has none)
            self._tokens += int(tokens["attention_mask"].sum())
            self._slots += tokens["attention_mask"].numel()
            self._forwards += 1
        return self.model(**tokens)  # (m, d)

    def loss_from(self, emb: torch.Tensor, b: int, mask: torch.Tensor, dataset: str) -> dict[str, torch.Tensor]:
        """The losses of one rank's rows from the embeddings (N, d) of `texts`, negatives placed by `mask` (b, K)."""
        q, p = emb[:b], emb[b : 2 * b]  # (b, d) each
        n = None
        if mask.shape[1]:
            n = emb.new_zeros(b, mask.shape[1], emb.shape[-1])  # (b, K, d)
            n = n.index_put((mask.nonzero(as_tuple=True)), emb[2 * b :])  # the real negatives into their slots
        cfg = self.cfg
        kwargs = {"tau": cfg.tau, "joint": cfg.joint_softmax, "gather_grad": cfg.gather_with_grad,
                  "weight": cfg.loss_weights.get(dataset, 1.0),
                  "negative_mask": None if n is None else mask}  # fmt: skip
        if cfg.mrl_dims:  # the full width, weight 1, then each smaller width
            dims, weights = (q.shape[-1], *cfg.mrl_dims), (1.0, *cfg.mrl_weights) if cfg.mrl_weights else None
            return matryoshka_loss(q, p, n, dims, weights, **kwargs)
        return contrastive_loss(q, p, n, **kwargs)

    def forward_backward(self, batch: dict[str, list]) -> dict[str, torch.Tensor]:
        """One step's forward and backward; returns the losses (means over ranks) and `short_of_k`."""
        texts, mask = self.texts(batch)
        b, dataset = len(batch["query"]), batch["dataset"][0]
        short = torch.tensor(float((~mask).any(1).sum()) if mask.shape[1] else 0.0)  # this rank's rows short of K
        plan = self.micro_batches(texts, b)
        order = torch.tensor([i for idx, _ in plan for i in idx])  # micro-batch row -> text
        back = torch.empty_like(order)
        back[order] = torch.arange(len(order))  # text -> micro-batch row
        if not self.cfg.grad_cache:
            emb = torch.cat([self.embed(tokens) for _, tokens in plan])[back]  # (N, d), in text order
            out = self.loss_from(emb, b, mask, dataset)
            logged = self.agree_finite(out, dataset, short)
            out["loss"].backward()
            return logged
        states, parts = [], []
        with torch.no_grad():
            for _, tokens in plan:
                states.append(rng_state())
                parts.append(self.embed(tokens))
        cached = torch.cat(parts)[back].detach().requires_grad_()  # (N, d), in text order
        out = self.loss_from(cached, b, mask, dataset)
        logged = self.agree_finite(out, dataset, short)
        out["loss"].backward()
        grads = cached.grad[order].split([len(idx) for idx, _ in plan])  # (m, d) per micro-batch
        for i, ((_, tokens), state, grad) in enumerate(zip(plan, states, grads, strict=True)):
            last = i == len(plan) - 1  # each rank's last backward is its one all-reduce, whatever its count
            sync = (
                self.model.no_sync()
                if isinstance(self.model, DistributedDataParallel) and not last
                else contextlib.nullcontext()
            )
            with sync:
                set_rng_state(state)  # the same dropout masks as in the graph-free pass
                self.embed(tokens).backward(grad)
        return logged

    def agree_finite(
        self, out: dict[str, torch.Tensor], dataset: str, short: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Every rank's losses, gathered before the backward: a non-finite one stops every rank. Returns means over
        ranks."""
        keys = ["loss", "in_batch", "hard_negative", *sorted(k for k in out if k.startswith("loss@"))]
        local = torch.stack([out[k].detach().float().reshape(()) for k in keys])  # (L,)
        short = torch.zeros(()) if short is None else short.float().reshape(())
        short = short.to(local.device)
        every = gather_without_grad(torch.cat([local, short[None]])[None])  # (W, L + 1), rank order
        bad = [r for r in range(every.shape[0]) if not torch.isfinite(every[r, :-1]).all()]
        if bad:
            where = f" on rank {', '.join(map(str, bad))} of {self.world_size}" if self.world_size > 1 else ""
            raise NonFiniteLoss(
                f"the loss is {every[bad[0], 0].item()} at step {self.step + 1} (dataset {dataset}){where}; stopping "
                f"before the update. Last checkpoint written, with finite weights (finite, not necessarily good: check "
                f"its loss): {self.last_good()}"
            )
        mean = every[:, :-1].mean(0)  # (L,)
        return {**{key: mean[i] for i, key in enumerate(keys)}, "short_of_k": every[:, -1].sum()}

    def refuse_gradients(self, dataset: str) -> None:
        """Stops before the update on non-finite gradients of a finite loss, naming the tensors."""
        bad = [n for n, p in self.trained if p.grad is not None and not torch.isfinite(p.grad).all()]
        backbone = self.encoder.backbone_config
        raise NonFiniteGradients(
            f"the gradients at step {self.step + 1} (dataset {dataset}) are non-finite in {len(bad)} of "
            f"{len(self.trained)} trainable tensors (e.g. {bad[:3]}) though the loss was finite: the backward pass "
            f"made them (backbone dtype {next(self.encoder.base_model.parameters()).dtype}, attention "
            f"{getattr(backbone, '_attn_implementation', 'unknown')}, device {self.encoder.device}); stopping before "
            f"the update. Last checkpoint written, with finite weights (finite, not necessarily good: check its loss): "
            f"{self.last_good()}"
        )

    def check_weights(self, dataset: str) -> None:
        """After an update: every trainable weight finite on every rank, or the run stops before checkpointing."""
        finite = torch.stack([torch.isfinite(p).all() for _, p in self.trained]).all()
        if all_ranks_true(finite):
            return
        bad = [n for n, p in self.trained if not torch.isfinite(p).all()]
        raise NonFiniteWeights(
            f"the update at step {self.step + 1} (dataset {dataset}) made trainable weights non-finite "
            f"({len(bad)} tensors, e.g. {bad[:3]}); stopping before it is checkpointed (check learning_rate and "
            f"max_grad_norm). Last checkpoint written, with finite weights (finite, not necessarily good: check its "
            f"loss): {self.last_good()}"
        )
