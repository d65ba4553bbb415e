"""Hard-negative mining (section 4.1: K = 7 per query) among the positives of a query's (dataset, language) group,
by BM25 or a teacher encoder, never a correct answer or its near-duplicate: docs/data.md#hard-negatives."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .records import text_key

_TOKEN = re.compile(r"\w+")


def token_set(text: str) -> frozenset[str]:
    return frozenset(t.lower() for t in _TOKEN.findall(text))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def bm25_ranker(corpus: Sequence[str]) -> Callable[[Sequence[str], int], np.ndarray]:
    """`rank(queries, k)`: indices (Q, k) of the best-scoring corpus documents under BM25, the corpus indexed once."""
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(list(corpus), stopwords=None, show_progress=False), show_progress=False)

    def rank(queries: Sequence[str], k: int) -> np.ndarray:
        k = min(k, len(corpus))
        results, _ = retriever.retrieve(
            bm25s.tokenize(list(queries), stopwords=None, show_progress=False), k=k, show_progress=False, n_threads=1
        )
        return np.asarray(results)

    return rank


def encoder_ranker(
    encode: Callable[..., np.ndarray], queries: Sequence[str], corpus: Sequence[str]
) -> Callable[[Sequence[str], int], np.ndarray]:
    """`rank(some of queries, k)`: indices (Q, k) of the nearest corpus documents by cosine, every text encoded once."""
    embedded = dict(zip(queries, encode(list(queries), kind="query"), strict=True))
    documents = encode(list(corpus), kind="document")  # (N, d)

    def rank(asked: Sequence[str], k: int) -> np.ndarray:
        scores = np.stack([embedded[q] for q in asked]) @ documents.T  # (Q, N)
        k = min(k, len(corpus))
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(scores, top, axis=1).argsort(axis=1)[:, ::-1]
        return np.take_along_axis(top, order, axis=1)

    return rank


def select_negatives(
    candidates: np.ndarray,
    queries: Sequence[str],
    positives: Sequence[str],
    k: int,
    near_duplicate: float = 0.9,
    rows: Sequence[int] | None = None,
) -> list[list[int]]:
    """For row i, up to k candidate indices (in order) that are neither a positive of a row with row i's query key
    nor a near-duplicate of one; `rows`: the row each line of `candidates` ranks for (default: line i)."""
    if len(queries) != len(positives):
        raise ValueError(f"{len(queries)} queries but {len(positives)} positives")
    keys = [text_key(p) for p in positives]
    tokens = [token_set(p) for p in positives]
    query_keys = [text_key(q) for q in queries]
    same_query: dict[str, list[int]] = {}
    for i, key in enumerate(query_keys):
        same_query.setdefault(key, []).append(i)
    answer_keys = {q: {keys[a] for a in rows} for q, rows in same_query.items()}
    # one verdict per (query, candidate): rows with one query (thousands for a commit message such as
    # "Fix typo") share BM25's ranking, so each candidate is compared with their answers only once
    answers_it: dict[tuple[str, int], bool] = {}

    def is_answer(q: str, j: int) -> bool:
        if (q, j) not in answers_it:
            answers_it[q, j] = keys[j] in answer_keys[q] or any(
                jaccard(tokens[a], tokens[j]) >= near_duplicate for a in same_query[q]
            )
        return answers_it[q, j]

    chosen = []
    for i, row in zip(range(len(candidates)) if rows is None else rows, candidates, strict=True):
        picked: list[int] = []
        for j in map(int, row):
            if is_answer(query_keys[i], j):  # row i's own positive, or another correct answer to its query
                continue
            if j not in picked:
                picked.append(j)
            if len(picked) == k:
                break
        chosen.append(picked)
    return chosen


def mine_negatives(
    queries: Sequence[str],
    positives: Sequence[str],
    k: int = 7,
    method: str = "bm25",
    encode: Callable[..., np.ndarray] | None = None,
    near_duplicate: float = 0.9,
) -> list[list[str]]:
    """Hard negatives (texts) for each row of one group; a short row is ranked deeper until it has k or its group is
    exhausted."""
    if len(queries) != len(positives):
        raise ValueError(f"{len(queries)} queries but {len(positives)} positives")
    if not queries or k == 0:
        return [[] for _ in queries]
    if method == "bm25":
        rank = bm25_ranker(positives)
    elif method == "encoder":
        if encode is None:
            raise ValueError("method='encoder' needs `encode` (e.g. C2LLMEncoder.encode) as the teacher")
        rank = encoder_ranker(encode, queries, positives)
    else:
        raise ValueError(f"unknown mining method {method!r}; choose 'bm25' or 'encoder'")
    depth = k * 4 + 1  # oversampled: candidates that answer the query are dropped
    picked = select_negatives(rank(queries, depth), queries, positives, k, near_duplicate)
    while depth < len(positives):
        short = [i for i, row in enumerate(picked) if len(row) < k]
        if not short:
            break
        depth = min(len(positives), depth * 4)
        deeper = rank([queries[i] for i in short], depth)
        for i, row in zip(short, select_negatives(deeper, queries, positives, k, near_duplicate, rows=short),
                          strict=True):  # fmt: skip
            picked[i] = row
    return [[positives[j] for j in row] for row in picked]


@dataclass(frozen=True)
class OwnNegatives:
    """Each row's own negatives as kept (at most k, in order, without repeats or correct answers), and what went."""

    kept: list[list[str]]
    answers: int  # own negatives dropped as a correct answer to their row's query
    cut: int  # rows that brought more than k distinct negatives (the first k are kept)


def own_negatives(
    queries: Sequence[str], positives: Sequence[str], given: Sequence[Sequence[str]], k: int
) -> OwnNegatives:
    """Row i's own negatives, at most k, without repeats or correct answers (a positive of a row with its query)."""
    if not len(queries) == len(positives) == len(given):
        raise ValueError(f"{len(queries)} queries, {len(positives)} positives, {len(given)} lists of negatives")
    answer_keys: dict[str, set[str]] = {}
    for query, positive in zip(queries, positives, strict=True):
        answer_keys.setdefault(text_key(query), set()).add(text_key(positive))
    kept, answers, cut = [], 0, 0
    for query, negatives in zip(queries, given, strict=True):
        correct, seen, row = answer_keys[text_key(query)], set(), []
        for negative in negatives:
            key = text_key(negative)
            if key in correct:
                answers += 1
            elif key not in seen:
                seen.add(key)
                row.append(negative)
        cut += len(row) > k
        kept.append(row[:k])
    return OwnNegatives(kept, answers, cut)


def top_up_negatives(
    queries: Sequence[str],
    positives: Sequence[str],
    own: Sequence[Sequence[str]],
    k: int,
    method: str = "bm25",
    encode: Callable[..., np.ndarray] | None = None,
) -> list[list[str]]:
    """Row i's own negatives followed by mined ones not among them, up to k; nothing is mined when none is short."""
    short = [len(row) < k for row in own]
    if not any(short):
        return [list(row) for row in own]
    depth = k + max(len(row) for row, is_short in zip(own, short, strict=True) if is_short)  # room for overlaps
    mined = mine_negatives(queries, positives, depth, method, encode)
    out = []
    for row, extra in zip(own, mined, strict=True):
        keys = {text_key(n) for n in row}
        out.append(list(row) + [n for n in extra if text_key(n) not in keys][: max(0, k - len(row))])
    return out
