"""Our scorer (paper section 4.2): exact top-k by cosine in chunks, nDCG@10 and recall on ranked ids, BM25, the
per-query scores behind every mean, MRL-style truncated widths, and the untrained-pooler baselines. Documents are
prepared as mteb prepares a corpus (`corpus_text`), so these scores equal `mteb.evaluate`'s on the same task."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..data.negatives import bm25_ranker
from ..model import C2LLMEncoder
from ..model.released import is_released_checkpoint, released_directory
from ..retrieval import RetrievalTask, corpus_text, truncate
from .intervals import task_means
from .tasks import instruction_overrides, task_prompts


def chunked_topk(queries: np.ndarray, corpus: np.ndarray, k: int, chunk: int = 65_536) -> tuple[np.ndarray, np.ndarray]:
    """(scores, indices), each (Q, k), of the k best corpus rows by dot product, best first: the corpus is scored
    `chunk` rows at a time into a running top-k, so extra memory is O(Q * (chunk + k)) (CodeSearchNet: 1M documents)."""
    q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))  # (Q, d)
    k = min(k, len(corpus))
    best_s = torch.full((q.shape[0], 0), -math.inf)
    best_i = torch.zeros((q.shape[0], 0), dtype=torch.long)
    for start in range(0, len(corpus), chunk):
        block = torch.from_numpy(np.ascontiguousarray(corpus[start : start + chunk], dtype=np.float32))  # (c, d)
        scores = q @ block.T  # (Q, c)
        s, i = scores.topk(min(k, scores.shape[1]), dim=1)  # (Q, <=k)
        merged_s = torch.cat([best_s, s], dim=1)
        merged_i = torch.cat([best_i, i + start], dim=1)
        top = merged_s.topk(k if merged_s.shape[1] >= k else merged_s.shape[1], dim=1)
        best_s, best_i = top.values, merged_i.gather(1, top.indices)
    return best_s.numpy(), best_i.numpy()


def ndcg_at_k(ranked: Sequence[str], relevant: dict[str, int], k: int = 10) -> float:
    """nDCG@k of one ranking: sum (2^rel - 1) / log2(rank + 1), divided by the ideal ranking's."""
    dcg = sum((2 ** relevant.get(doc, 0) - 1) / math.log2(r + 2) for r, doc in enumerate(ranked[:k]))
    ideal = sorted(relevant.values(), reverse=True)[:k]
    idcg = sum((2**rel - 1) / math.log2(r + 2) for r, rel in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def query_ndcg(task: RetrievalTask, rankings: dict[str, list[str]], k: int = 10) -> dict[str, float]:
    """{query id: nDCG@k} of each query's ranking: the per-query values whose mean is the task's score."""
    return {q: ndcg_at_k(rankings[q], task.qrels[q], k) for q in task.queries}


def embedding_rankings(task: RetrievalTask, queries: np.ndarray, documents: np.ndarray, k: int = 10):
    """{query id: its top k document ids} by cosine of normalised (Q, d) and (N, d) embeddings."""
    doc_ids = list(task.corpus)
    _, top = chunked_topk(queries, documents, k)  # (Q, k)
    return {q: [doc_ids[j] for j in row] for q, row in zip(task.queries, top, strict=True)}


def task_embeddings(
    encoder, task: RetrievalTask, batch_size: int = 16, max_length: int | None = None, prompt: tuple | None = None
):
    """Unnormalised (queries (Q, d), documents (N, d)) with the encoder's prompts or `prompt`."""
    query, document = prompt or task_prompts(encoder.config, task.name, instruction_overrides(encoder.config, [task]))
    kwargs = {"batch_size": batch_size, "max_length": max_length, "normalize": False}
    docs = encoder.encode([corpus_text(t) for t in task.corpus.values()], kind="document", instruction=document,
                          **kwargs)  # fmt: skip
    return encoder.encode(list(task.queries.values()), kind="query", instruction=query, **kwargs), docs


def truncation_query_scores(
    task: RetrievalTask, queries: np.ndarray, documents: np.ndarray, dims: Sequence[int], k: int = 10
) -> dict[int, dict[str, float]]:
    """{d: {query id: nDCG@k}} with every embedding cut to its first d coordinates and re-normalised (`truncate`)."""
    width = queries.shape[1]
    bad = [d for d in dims if not 0 < d <= width]
    if bad:
        raise ValueError(f"cannot truncate {width}-dimensional embeddings to {bad}")
    return {
        d: query_ndcg(task, embedding_rankings(task, truncate(queries, d), truncate(documents, d), k), k) for d in dims
    }


def bm25_scores(tasks: Sequence[RetrievalTask]) -> dict[str, float]:
    """{task: nDCG@10} of the BM25 baseline: the means of `bm25_query_scores`."""
    return task_means(bm25_query_scores(tasks))


def bm25_query_scores(tasks: Sequence[RetrievalTask], k: int = 10) -> dict[str, dict[str, float]]:
    """{task: {query id: nDCG@k}} of the BM25 baseline (the values whose means `bm25_scores` gives)."""
    return {t.name: query_ndcg(t, bm25_rankings(t, k), k) for t in tasks}


def bm25_rankings(task: RetrievalTask, k: int = 10) -> dict[str, list[str]]:
    """{query id: the ids of BM25's top k documents, best first} (bm25s, default parameters, no stopwords)."""
    doc_ids = list(task.corpus)
    top = bm25_ranker([corpus_text(task.corpus[d]) for d in doc_ids])(list(task.queries.values()), k)  # (Q, k)
    return {q: [doc_ids[j] for j in row] for q, row in zip(task.queries, top, strict=True)}


def baseline_encoder(trained, pooling: str):
    """`trained`'s backbone before training (or a release's) with a mean or last-token pooler."""
    cfg = trained.config
    if is_released_checkpoint(cfg.backbone):
        return C2LLMEncoder.from_released(
            cfg.backbone,
            device=cfg.device,
            dtype=cfg.dtype,
            attn_implementation=cfg.attn_implementation,
            max_length=cfg.max_length,
            pooling=pooling,
        )
    cfg = dataclasses.replace(cfg, pooling=pooling, use_lora=False, embedding_dim=None,
                              append_eos=None, gradient_checkpointing=False)  # fmt: skip
    # a saved LoRA encoder (notebook 03's merged/) keeps the untouched base beside its adapter: read it (seconds)
    # rather than convert the backbone again (the GGUF: ~40 s on 2 cores); the same tensors either way
    folder = getattr(trained, "directory", None)
    saved = folder and C2LLMEncoder.saved_base(folder, cfg)
    return saved or C2LLMEncoder.from_config(cfg)


def baselines(trained, poolings: Sequence[str]) -> dict[str, Any]:
    """{label: baseline encoder} per pooling, all on one loaded backbone and tokenizer object."""
    kind = "released backbone" if is_released_checkpoint(trained.config.backbone) else "untrained"
    if not poolings:
        return {}
    first = baseline_encoder(trained, poolings[0])
    built = {poolings[0]: first}
    for p in poolings[1:]:
        built[p] = C2LLMEncoder(first.backbone, first.tokenizer, dataclasses.replace(first.config, pooling=p))
        built[p].directory = first.directory  # a release's backbone: keyed by its folder too (mteb.fingerprint)
    return {f"{kind}, {p} pooling": built[p] for p in poolings}


def evaluated_models(evaluation, run_dir) -> tuple[str, dict[str, Any]]:
    """(label, {label: the release or the run's `merged/`, then its `baselines`}) for notebook 04."""
    if evaluation.eval_released:
        label = f"released {evaluation.eval_released}"
        trained = C2LLMEncoder.from_released(released_directory(evaluation.eval_released,
                                                                evaluation.eval_released_revision))  # fmt: skip
    else:
        label, trained = "C2LLM recipe (merged)", C2LLMEncoder.from_pretrained(run_dir.require("merged"))
    poolings = [p for p in evaluation.baselines if p != "bm25"] if scores_untrained(evaluation) else []
    return label, {label: trained, **baselines(trained, poolings)}


def scores_untrained(evaluation) -> bool:
    """Whether notebook 04 loads the untrained poolers: a mean or last-token baseline is asked for, and a task set
    `untrained_sets` names is evaluated (the held-out tasks always; the BEIR sets and unseen libraries when given)."""
    used = {"heldout": True, "beir": bool(evaluation.beir_sets), "unseen": bool(evaluation.unseen_packages)}
    return any(p != "bm25" for p in evaluation.baselines) and any(used[name] for name in evaluation.untrained_sets)
