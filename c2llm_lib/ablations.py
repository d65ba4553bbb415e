"""The paper's two claims about the head, tested on equal terms (section 3's takeaway).

1. PMA pools better than the EOS (last) token and the mean: the three poolers are trained the same way (same
   rows, steps, seed, LoRA and learning rate) and evaluated on the same tasks.
2. PMA's projection gives compact embeddings without MRL training: PMA trained with output dimension d
   (equations 2-3 project to d) against the full-width PMA embedding truncated to its first d coordinates.

`variants` names the model configurations, `train_variant` trains one with a run's training recipe,
and `Truncated` presents a truncated encoder to the evaluation code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from .config import ModelConfig, TrainConfig
from .model import C2LLMEncoder
from .retrieval import truncate
from .train import Trainer


def variants(base: ModelConfig, dims: Sequence[int]) -> dict[str, ModelConfig]:
    """Pooler and dimension variants of `base` (a PMA configuration at full width)."""
    full = dataclasses.replace(base, pooling="pma", embedding_dim=None, append_eos=None)
    out = {
        "PMA (trained)": full,
        "last token (trained)": dataclasses.replace(full, pooling="last_token"),
        "mean (trained)": dataclasses.replace(full, pooling="mean"),
    }
    for d in dims:
        out[f"PMA d={d} (trained)"] = dataclasses.replace(full, embedding_dim=d)
    return out


def train_variant(model: ModelConfig, train: TrainConfig, rows) -> C2LLMEncoder:
    """A fresh encoder of configuration `model`, trained with the recipe `train` on `rows` (no checkpoints)."""
    torch.manual_seed(train.seed)
    encoder = C2LLMEncoder.from_config(dataclasses.replace(model, use_lora=True))
    Trainer(encoder, rows, dataclasses.replace(train, checkpoint_steps=[], checkpoint_fractions=[])).train()
    return encoder.eval()


class Truncated:
    """An encoder whose embeddings are cut to their first `dim` coordinates and re-normalised (the MRL-style
    alternative that PMA's projection is compared with)."""

    def __init__(self, encoder: C2LLMEncoder, dim: int) -> None:
        if not 0 < dim <= encoder.embedding_dim:
            raise ValueError(f"cannot truncate a {encoder.embedding_dim}-dimensional embedding to {dim}")
        self.encoder, self.embedding_dim, self.config = encoder, dim, encoder.config

    def encode(self, texts, **kwargs) -> np.ndarray:
        normalize = kwargs.pop("normalize", True)
        full = self.encoder.encode(texts, normalize=False, **kwargs)  # (N, d)
        return truncate(full, self.embedding_dim) if normalize else full[:, : self.embedding_dim]
