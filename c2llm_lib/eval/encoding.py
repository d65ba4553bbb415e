"""Embeddings computed once per evaluation: `EncodingCache` embeds each formatted text once per encoder, serves a
`Truncated` view from its encoder's embeddings, and runs encoders on one backbone object (the untrained baselines)
through one backbone pass per text (`shared_forward`); docs/evaluation.md#held-out-tasks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..batching import length_batches
from ..model import C2LLMEncoder
from ..model.encoder import _check_texts
from ..retrieval import Truncated, truncate


def shared_forward(encoders: Sequence[Any], texts: Sequence[str], max_length: int, batch_size: int = 16):
    """Unnormalised float32 embeddings, one (N, d_i) array per encoder, of formatted `texts` for encoders sharing one
    backbone and tokenizer object, and the number of sequences run. A text shorter than `max_length` serves encoders
    with and without an appended EOS in one pass (attention is causal); a longer one gets a pass per cut."""
    first = encoders[0]
    eos = first.tokenizer.eos_token_id
    wants_eos = [e.config.eos_appended for e in encoders]
    if max_length < 2 and any(wants_eos):
        raise ValueError(f"max_length={max_length} leaves no room for text before the EOS token")
    plain = [i for i, w in enumerate(wants_eos) if not w]
    with_eos = [i for i, w in enumerate(wants_eos) if w]
    ids = first.tokenizer(list(texts), add_special_tokens=False, truncation=True, max_length=max_length,
                          return_attention_mask=False)["input_ids"]  # fmt: skip
    jobs = []  # (tokens, text index, [(encoder index, how many leading tokens it pools)])
    for t, row in enumerate(ids):
        if with_eos and len(row) < max_length:
            jobs.append((row + [eos], t, [(i, len(row)) for i in plain] + [(i, len(row) + 1) for i in with_eos]))
            continue
        if plain:
            jobs.append((row, t, [(i, len(row)) for i in plain]))
        if with_eos:
            jobs.append((row[: max_length - 1] + [eos], t, [(i, min(len(row) + 1, max_length)) for i in with_eos]))
    # grouped by token length as C2LLMEncoder.encode groups (batching.length_batches): little compute is spent on
    # padding, and an encoder alone on its backbone, given the texts encode was given (distinct), gets exactly
    # encode's batches, so exactly its embeddings
    groups = length_batches([len(job[0]) for job in jobs], batch_size, fill=first.device.type != "cpu")
    batches = [[jobs[j] for j in group] for group in groups]
    out = [np.zeros((len(ids), e.embedding_dim), dtype=np.float32) for e in encoders]
    was_training = [e.training for e in encoders]
    for e in encoders:
        e.eval()
    try:
        with torch.inference_mode():
            for batch in batches:
                width = max(1, max(len(job[0]) for job in batch))
                input_ids = torch.full((len(batch), width), first.tokenizer.pad_token_id, dtype=torch.long)  # (B, T)
                pooled = torch.zeros((len(encoders), len(batch), width), dtype=torch.bool)  # (E, B, T)
                for b, (tokens, _, readers) in enumerate(batch):
                    begin = width - len(tokens)  # left padding
                    input_ids[b, begin:] = torch.tensor(tokens, dtype=torch.long)
                    for i, n in readers:
                        pooled[i, b, begin : begin + n] = True
                attention_mask = pooled.any(dim=0).long()  # (B, T): every token some encoder reads
                hidden = first.hidden_states(input_ids, attention_mask)  # (B, T, d_LLM)
                for i, encoder in enumerate(encoders):
                    rows = [b for b, job in enumerate(batch) if any(r == i for r, _ in job[2])]
                    mask = pooled[i, rows].to(hidden.device)  # (b, T)
                    emb = encoder.pooler(hidden[rows].masked_fill(~mask[..., None], 0.0), mask.long())  # (b, d)
                    out[i][[batch[b][1] for b in rows]] = emb.float().cpu().numpy()
    finally:
        for e, mode in zip(encoders, was_training, strict=True):
            e.train(mode)
    return out, len(jobs)


class EncodingCache:
    """Embeddings per (encoder, max length, formatted text) for one evaluation: registered encoders on one backbone are
    computed together (`shared_forward`), a `Truncated` view reads its encoder's, anything else calls its own `encode`.
    `sequences` counts the sequences run."""

    def __init__(self, models: Sequence[Any] = ()) -> None:
        self.encoders: dict[int, Any] = {}  # id -> encoder; held here, so an id is never reused
        self.store: dict[tuple[int, int], dict[str, np.ndarray]] = {}  # (id, max length) -> {text: (d,)}
        self.sequences = 0
        for model in models:
            self.add(model)

    @staticmethod
    def unwrap(model) -> tuple[Any, int | None]:
        """(the C2LLMEncoder behind `model`, the width a Truncated view cuts to), or (None, None)."""
        if isinstance(model, Truncated) and isinstance(model.encoder, C2LLMEncoder):
            return model.encoder, model.embedding_dim
        return (model, None) if isinstance(model, C2LLMEncoder) else (None, None)

    def add(self, model) -> None:
        encoder, _ = self.unwrap(model)
        if encoder is not None:
            self.encoders[id(encoder)] = encoder

    def siblings(self, encoder) -> list[Any]:
        """`encoder` first, then the registered encoders on the same backbone and tokenizer objects."""
        return [encoder] + [
            e for e in self.encoders.values()
            if e is not encoder and e.backbone is encoder.backbone and e.tokenizer is encoder.tokenizer
        ]  # fmt: skip

    def encode(
        self,
        model,
        texts: Sequence[str],
        *,
        kind: str = "query",
        instruction: str | None = None,
        batch_size: int = 16,
        max_length: int | None = None,
        normalize: bool = True,
    ) -> np.ndarray:
        """What `model.encode` returns for these arguments (float32 (N, d)), computing only unseen texts."""
        encoder, width = self.unwrap(model)
        if encoder is None:
            return model.encode(texts, kind=kind, instruction=instruction, batch_size=batch_size,
                                max_length=max_length, normalize=normalize)  # fmt: skip
        self.add(encoder)
        length = max_length or encoder.config.max_length
        formatted = encoder.format_texts(_check_texts(texts), kind, instruction)
        store = self.store.setdefault((id(encoder), length), {})
        missing = list(dict.fromkeys(t for t in formatted if t not in store))  # distinct, first-seen order
        if missing:
            group = self.siblings(encoder)
            arrays, sequences = shared_forward(group, missing, length, batch_size)
            self.sequences += sequences
            for member, array in zip(group, arrays, strict=True):
                kept = self.store.setdefault((id(member), length), {})
                for text, row in zip(missing, array, strict=True):
                    kept.setdefault(text, row)
        full = np.stack([store[t] for t in formatted]) if formatted else np.empty((0, encoder.embedding_dim))
        full = full.astype(np.float32)  # (N, d)
        if width is not None:  # a Truncated view: cut, then re-normalised as Truncated.encode does
            return truncate(full, width) if normalize else full[:, :width]
        return torch.nn.functional.normalize(torch.from_numpy(full), dim=-1).numpy() if normalize else full
