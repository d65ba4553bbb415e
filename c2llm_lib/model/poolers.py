"""Baseline poolers the paper argues against (section 3): last real token (EOS) and mean over real tokens, with the PMA
head's interface, in float32. A weights file records its head (`head_record`), which `load_pooler_weights` checks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file
from torch import nn

from ..files import CorruptFile, load_tensors, tensor_metadata
from .pma import PMAHead, ScoreScale

Pooling = Literal["pma", "last_token", "mean"]
POOLINGS: tuple[str, ...] = ("pma", "last_token", "mean")


class LastTokenPooler(nn.Module):
    """The hidden state of each row's last real token (the EOS token when the encoder appends it)."""

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, _ = hidden.shape
        positions = torch.arange(T, device=hidden.device).expand(B, T)  # (B, T)
        last = (positions * mask.to(hidden.device).bool()).argmax(dim=1)  # (B,), index of the last real token
        return hidden[torch.arange(B, device=hidden.device), last].float()  # (B, d_LLM)


class MeanPooler(nn.Module):
    """The average hidden state over real tokens."""

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.to(dtype=torch.float32, device=hidden.device)[..., None]  # (B, T, 1)
        total = (hidden.float() * m).sum(dim=1)  # (B, d_LLM)
        return total / m.sum(dim=1).clamp(min=1.0)  # (B, d_LLM)


def build_pooler(
    pooling: Pooling,
    hidden_size: int,
    embedding_dim: int | None = None,
    pma_heads: int = 32,
    pma_score_scale: ScoreScale = "full_width",
) -> nn.Module:
    """The pooler named by `pooling`; `embedding_dim` is only meaningful for PMA (eq. 2-3 project to d)."""
    if pooling == "pma":
        return PMAHead(hidden_size, embedding_dim, pma_heads, pma_score_scale)
    if embedding_dim not in (None, hidden_size):
        raise ValueError(
            f"embedding_dim={embedding_dim} needs pooling='pma': {pooling} pooling returns the backbone's "
            f"hidden size {hidden_size} (truncate the embedding instead)"
        )
    if pooling == "last_token":
        return LastTokenPooler()
    if pooling == "mean":
        return MeanPooler()
    raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")


HEAD_METADATA = "c2llm_head"  # the safetensors metadata key of a pooler's weights file: `head_record` as JSON


def head_record(pooler: nn.Module) -> dict[str, Any]:
    """What sets a pooler's computation besides its tensors (the PMA head count and score scale, for one)."""
    if isinstance(pooler, PMAHead):
        return {"pooling": "pma", "hidden_size": pooler.hidden_size, "embedding_dim": pooler.dim,
                "pma_heads": pooler.num_heads, "pma_score_scale": pooler.score_scale}  # fmt: skip
    return {"pooling": "last_token" if isinstance(pooler, LastTokenPooler) else "mean"}


def save_pooler(pooler: nn.Module, path: str | os.PathLike) -> None:
    """The pooler's tensors (float32) as safetensors, with its `head_record` in the metadata."""
    tensors = {k: v.detach().float().contiguous().cpu() for k, v in pooler.state_dict().items()}
    save_file(tensors, path, metadata={"format": "pt", HEAD_METADATA: json.dumps(head_record(pooler))})


def load_pooler_weights(pooler: nn.Module, path: str | os.PathLike, settings: str | os.PathLike) -> None:
    """Loads `path` into `pooler`; refuses, naming both files, another recorded head, misfit or non-finite tensors."""
    path = Path(path)
    tensors = load_tensors(path, "pooler weights")
    expected = head_record(pooler)
    recorded = tensor_metadata(path).get(HEAD_METADATA)
    if recorded is not None:
        try:
            recorded = json.loads(recorded)
        except json.JSONDecodeError as err:
            raise CorruptFile(f"{path}: its {HEAD_METADATA} metadata is not valid JSON ({err})") from None
        if recorded != expected:
            differ = sorted(k for k in set(recorded) | set(expected) if recorded.get(k) != expected.get(k))
            raise CorruptFile(
                f"{path} holds the weights of the head {recorded}, but {settings} describes {expected} (they differ "
                f"in {differ}); the settings file was changed or belongs to another model"
            )
    own = {k: tuple(v.shape) for k, v in pooler.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in tensors.items()}
    if own != found:
        extra, missing = sorted(set(found) - set(own)), sorted(set(own) - set(found))
        shapes = sorted(k for k in set(own) & set(found) if own[k] != found[k])
        raise CorruptFile(
            f"{path} does not fit the {expected['pooling']} pooler that {settings} describes: tensors it should not "
            f"hold {extra}, tensors it lacks {missing}, shapes that differ {[(k, found[k], own[k]) for k in shapes]}"
        )
    pooler.load_state_dict(tensors)
