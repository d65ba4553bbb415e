"""Notebook 07's searcher (paper section 4.2's text->code retrieval): a query's top k by cosine beside BM25's,
known-answer queries and their ranks, and hits shaded by PMA attention (docs/search.md)."""

from __future__ import annotations

import hashlib
import html
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..attention import stored_attention
from ..config import SearchStage
from ..data.offline import TEXT_TO_CODE, pair_records
from ..data.records import DataError
from ..figures import attention_spans
from .index import IndexReport, SearchIndex
from .sources import Document, KnownQuery, Sources


@dataclass
class Hit:
    index: int  # the document's row in the index
    score: float  # cosine for the model, BM25's score for BM25


@dataclass
class SearchResult:
    query: KnownQuery
    model: list[Hit]  # at or above the threshold, best first, at most k
    bm25: list[Hit]  # sharing a word with the query, best first, at most k
    best: Hit  # the model's best hit, shown or not (how far under the threshold a query with no hit is)
    min_score: float
    model_rank: int | None = None  # where the expected function came back (1 = first); None: not known
    bm25_rank: int | None = None  # None also when BM25 scores it 0 (no shared word)
    model_seconds: float = 0.0  # the query's embedding and the ranking
    bm25_seconds: float = 0.0


class Searcher:
    """Queries against an index with its model and BM25; the BM25 index is built once, here, over the same code."""

    def __init__(self, index: SearchIndex, encoder) -> None:
        import bm25s

        expected = {k: v for k, v in index.settings.items() if k in ("pooling", "embedding_dim")}
        found = {"pooling": encoder.config.pooling, "embedding_dim": encoder.embedding_dim}
        if expected != found:
            raise ValueError(f"the index was built by a model with {expected}, this one has {found}: update the index "
                             "with this model (update_index)")  # fmt: skip
        if not len(index):
            raise ValueError("the index holds no function to search")
        self.index, self.encoder = index, encoder
        self.bm25 = bm25s.BM25()
        self.bm25.index(bm25s.tokenize([d.code for d in index.documents], stopwords=None, show_progress=False),
                        show_progress=False)  # fmt: skip
        self._shaded: dict[int, Any] = {}

    def search(self, query: str | KnownQuery, k: int = 5, min_score: float = 0.0) -> SearchResult:
        """The model's top `k` at or above `min_score` and BM25's top `k`, with the ranks of the expected function."""
        import bm25s

        query = query if isinstance(query, KnownQuery) else KnownQuery(query)
        if not isinstance(query.text, str) or not query.text.strip():
            raise ValueError(f"a query must be a non-empty text, got {query.text!r}")
        settings = self.index.settings
        tick = time.perf_counter()
        q = self.encoder.encode(
            [query.text],
            kind="query",
            instruction=settings["query_instruction"],
            max_length=settings["max_length"],
            show_progress=False,
        )[0]  # (d,)
        scores = self.index.embeddings @ q  # (N,) cosines
        model = _top(scores, k)
        model_seconds = time.perf_counter() - tick
        tick = time.perf_counter()
        words = bm25s.tokenize([query.text], stopwords=None, show_progress=False, return_ids=False)[0]
        lexical = self.bm25.get_scores(words) if words else np.zeros(len(self.index))  # (N,)
        bm25 = [h for h in _top(lexical, k) if h.score > 0]
        bm25_seconds = time.perf_counter() - tick
        result = SearchResult(query, [h for h in model if h.score >= min_score], bm25, model[0], min_score,
                              model_seconds=model_seconds, bm25_seconds=bm25_seconds)  # fmt: skip
        expected = [i for i, d in enumerate(self.index.documents) if query.known and query.matches(d)]
        if expected:
            best = max(expected, key=lambda i: scores[i])
            result.model_rank = 1 + int((scores > scores[best]).sum())
            best = max(expected, key=lambda i: lexical[i])
            result.bm25_rank = 1 + int((lexical > lexical[best]).sum()) if lexical[best] > 0 else None
        return result

    def shaded(self, row: int):
        """The document's tokens with their stored PMA attention (`attention.TokenAttention`), or None without PMA."""
        if self.index.attention is None:
            return None
        if row not in self._shaded:
            doc, settings = self.index.documents[row], self.index.settings
            self._shaded[row] = stored_attention(self.encoder, doc.code, self.index.attention[row], "document",
                                                 settings["document_instruction"], settings["max_length"])  # fmt: skip
        return self._shaded[row]


def _top(scores: np.ndarray, k: int) -> list[Hit]:
    """The k best rows, best first (ties in row order)."""
    k = min(k, len(scores))
    rows = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    rows = sorted(rows.tolist(), key=lambda i: (-scores[i], i))
    return [Hit(int(i), float(scores[i])) for i in rows]


def documented_queries(index: SearchIndex) -> list[KnownQuery]:
    """Known-answer queries from indexed functions' documentation (`offline.pair_records`)."""
    out = []
    for d in index.documents:
        rows = pair_records(d.file, d.function, d.language, d.summary, d.code) if d.summary else []
        if any(r["dataset"] == TEXT_TO_CODE for r in rows):
            out.append(KnownQuery(d.summary, d.file, d.function, d.start_line))
    return out


def pick_queries(stage: SearchStage, sources: Sources, index: SearchIndex) -> list[KnownQuery]:
    """`search_queries`, or `search_query_count` known-answer queries chosen by a hash of their text."""
    if stage.search_queries:
        return [KnownQuery(q) for q in stage.search_queries]
    candidates = sources.heldout if sources.heldout is not None else documented_queries(index)
    named: dict[tuple[str, str], list[Document]] = {}
    for d in index.documents:
        named.setdefault((d.file, d.function), []).append(d)
    unique = [q for q in candidates if q.known and sum(map(q.matches, named.get((q.file, q.function), []))) == 1]
    if not unique:
        raise DataError(f"none of the {len(candidates)} known-answer queries has its function among the "
                        f"{len(index.files)} files indexed: raise search_max_files or give search_queries")  # fmt: skip
    unique.sort(key=lambda q: hashlib.sha256(q.text.encode()).hexdigest())
    return unique[: stage.search_query_count]


CELL = "vertical-align:top;padding:4px 8px;border-top:1px solid #ccc;width:50%;text-align:left"
CODE = "font-size:12px;line-height:1.5;max-height:18em;overflow:auto;margin:2px 0;white-space:pre"


def _hit_html(searcher: Searcher, hit: Hit, rank: int, query: KnownQuery, what: str) -> str:
    doc = searcher.index.documents[hit.index]
    mark = " <b style='color:#1a7f37'>&#10003; the expected function</b>" if query.known and query.matches(doc) else ""
    head = (f"<div class='c2llm-hit'>{rank}. <code>{html.escape(doc.where)}</code> <b>{html.escape(doc.function)}</b>"
            f" <span style='color:#555'>{what} {hit.score:.3f}</span>{mark}</div>")  # fmt: skip
    item = searcher.shaded(hit.index)
    if item is None:
        return head + f"<pre style='{CODE}'>{html.escape(doc.code)}</pre>"
    return head + attention_spans(item, CODE)


def result_html(searcher: Searcher, result: SearchResult) -> str:
    """One query's hits: the model's beside BM25's, with files, lines, scores, and the code shaded by PMA attention."""
    query = result.query
    lines = [f"<h4>{html.escape(query.text)}</h4>"]
    if query.known:
        ranks = (f"the model returns it at rank {result.model_rank}, BM25 at "
                 f"{result.bm25_rank if result.bm25_rank is not None else 'none (no shared word)'}")  # fmt: skip
        lines.append(f"<p>Expected: <code>{html.escape(query.file)}</code> <b>{html.escape(query.function)}</b>: "
                     f"{ranks}.</p>")  # fmt: skip
    if searcher.index.attention is None:
        lines.append(f"<p>This model pools by {searcher.encoder.config.pooling!r}: it has no attention to shade.</p>")
    model = [_hit_html(searcher, h, i + 1, query, "cosine") for i, h in enumerate(result.model)]
    if not model:
        best = searcher.index.documents[result.best.index]
        model = [f"<p class='c2llm-no-hit'>No hit scores above search_min_score = {result.min_score:g} (the best: "
                 f"{result.best.score:.3f}, <code>{html.escape(best.where)}</code>).</p>"]  # fmt: skip
    bm25 = [_hit_html(searcher, h, i + 1, query, "BM25") for i, h in enumerate(result.bm25)]
    bm25 = bm25 or ["<p class='c2llm-no-hit'>No indexed function shares a word with the query.</p>"]
    rows = "".join(f"<tr><td style='{CELL}'>{a}</td><td style='{CELL}'>{b}</td></tr>"
                   for a, b in itertools.zip_longest(model, bm25, fillvalue=""))  # fmt: skip
    timing = f"model {result.model_seconds * 1000:.0f} ms, BM25 {result.bm25_seconds * 1000:.0f} ms"
    table = "border-collapse:collapse;width:100%;table-layout:fixed"  # two equal columns, long lines scroll
    return ("".join(lines) + f"<table class='c2llm-hits' style='{table}'><tr>"
            f"<th style='{CELL}'>this run's model (cosine)</th><th style='{CELL}'>BM25</th></tr>{rows}</table>"
            f"<p style='color:#555'>{timing}</p>")  # fmt: skip


LEGEND = ("Each hit's code is shaded by the PMA head's attention over its tokens (mean over heads, relative to "
          "uniform: none = uniform, red = more, blue = less; paper section 3), the view of notebook 05. Hover a token "
          "for its weight.")  # fmt: skip


def results_page(searcher: Searcher, results: Sequence[SearchResult], title: str) -> str:
    """A whole HTML page of every query's hits."""
    body = "".join(result_html(searcher, r) for r in results)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
            f"<h3>{html.escape(title)}</h3><p>{html.escape(LEGEND)}</p>{body}</body></html>")  # fmt: skip


def results_frame(searcher: Searcher, results: Sequence[SearchResult]):
    """One row per query: the expected function, the rank each ranker gave it, the top hits and the time."""
    import pandas as pd

    docs = searcher.index.documents
    return pd.DataFrame([{
        "query": r.query.text[:60], "expected": f"{r.query.file} {r.query.function}" if r.query.known else "",
        "model rank": r.model_rank, "BM25 rank": r.bm25_rank,
        "model's first hit": docs[r.model[0].index].function if r.model else "(none above the threshold)",
        "BM25's first hit": docs[r.bm25[0].index].function if r.bm25 else "(no shared word)",
        "model ms": round(r.model_seconds * 1000),
    } for r in results]).astype({"model rank": "Int64", "BM25 rank": "Int64"})  # fmt: skip


def search_metrics(index: SearchIndex, report: IndexReport, results: Sequence[SearchResult], sources: Sources,
                   searcher: Searcher) -> dict[str, Any]:  # fmt: skip
    """What `metrics/search.json` records: the index, each query's hits and ranks, and a summary over known ones."""
    docs = index.documents

    def hits(found: list[Hit]) -> list[dict[str, Any]]:
        return [{"file": docs[h.index].file, "function": docs[h.index].function, "start_line": docs[h.index].start_line,
                 "end_line": docs[h.index].end_line, "score": round(h.score, 4)} for h in found]  # fmt: skip

    known = [r for r in results if r.query.known]
    summary = {"queries": len(results), "known": len(known)}
    for name in ("model", "bm25"):
        ranks = [getattr(r, f"{name}_rank") for r in known]
        summary[f"{name}_top1"] = sum(r == 1 for r in ranks)
        summary[f"{name}_mrr"] = round(sum(1 / r for r in ranks if r) / len(ranks), 4) if ranks else None
    summary["median_model_seconds"] = float(np.median([r.model_seconds for r in results])) if results else None
    return {
        "settings": index.settings, "sources": sources.lines(), "index": {
            **report.as_dict(), "walk": report.files.as_dict(), "files": len(index.files), "documents": len(index)},
        "queries": [{"query": r.query.text, "expected": {"file": r.query.file, "function": r.query.function}
                     if r.query.known else None, "model_rank": r.model_rank, "bm25_rank": r.bm25_rank,
                     "model_hits": hits(r.model), "bm25_hits": hits(r.bm25), "best_score": round(r.best.score, 4),
                     "model_seconds": round(r.model_seconds, 4), "bm25_seconds": round(r.bm25_seconds, 4)}
                    for r in results],
        "summary": summary,
    }  # fmt: skip


def search_widget(searcher: Searcher, k: int = 5, min_score: float = 0.0):
    """A JupyterLab query box (ipywidgets) showing the hits table, or the error, below it."""
    import ipywidgets as widgets

    box = widgets.Text(placeholder="describe the function you are looking for", description="Query:",
                       continuous_update=False, layout=widgets.Layout(width="70%"))  # fmt: skip
    button = widgets.Button(description="Search", button_style="primary")
    out = widgets.HTML(value="<p style='color:#555'>Type a query and press Enter.</p>")
    shown = {"query": None}

    def run(_: Any = None) -> None:
        query = box.value.strip()
        if query == shown["query"]:
            return
        shown["query"] = query
        try:
            out.value = result_html(searcher, searcher.search(query, k, min_score))
        except Exception as err:  # a widget callback's exception would only reach the log console
            out.value = f"<p style='color:crimson'>{html.escape(f'{type(err).__name__}: {err}')}</p>"

    def again(_: Any) -> None:
        shown["query"] = None
        run()

    box.observe(run, names="value")
    button.on_click(again)
    out.add_class("c2llm-search-hits")  # for a page's scripts and tests to find the hits
    return widgets.VBox([widgets.HBox([box, button]), out])
