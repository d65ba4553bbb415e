"""What every retrieval evaluation shares (section 4.2): the task shape, a model's document text, MRL truncation."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # a type only: the encoder is passed in
    from .model import C2LLMEncoder


@dataclass
class RetrievalTask:
    name: str
    queries: dict[str, str]  # query id -> text
    corpus: dict[str, str]  # doc id -> text
    qrels: dict[str, dict[str, int]]  # query id -> {doc id: relevance}
    instruction: str  # the query instruction (table 1)
    split_queries: int | None = None  # queries of the whole task when a limit drew fewer (`eval.tasks.limit_task`)
    seed: int | None = None  # the seed a limit drew the queries (and a document cap the documents) with


def file_safe(name: str) -> str:
    """A task name usable as a file name: letters, digits and . _ + # - kept, any other run of characters '-'."""
    return re.sub(r"[^A-Za-z0-9._+#-]+", "-", name).strip("-.") or "unnamed"


def corpus_text(text: str, title: str = "") -> str:
    """A document as mteb feeds it to a model: title and text joined, surrounding whitespace stripped."""
    return f"{title} {text}".strip() if title else text.strip()


def truncate(x: np.ndarray, dim: int) -> np.ndarray:
    """Rows cut to their first `dim` coordinates and re-normalised (MRL-style truncation), as float32."""
    cut = x[:, :dim]  # (N, dim)
    return (cut / np.clip(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12, None)).astype(np.float32)


class Truncated:
    """An encoder whose embeddings are cut to `dim` and re-normalised (the MRL-style alternative to PMA)."""

    def __init__(self, encoder: C2LLMEncoder, dim: int) -> None:
        if not 0 < dim <= encoder.embedding_dim:
            raise ValueError(f"cannot truncate a {encoder.embedding_dim}-dimensional embedding to {dim}")
        self.encoder, self.embedding_dim, self.config = encoder, dim, encoder.config

    def encode(self, texts, **kwargs) -> np.ndarray:
        normalize = kwargs.pop("normalize", True)
        full = self.encoder.encode(texts, normalize=False, **kwargs)  # (N, d)
        return truncate(full, self.embedding_dim) if normalize else full[:, : self.embedding_dim]
