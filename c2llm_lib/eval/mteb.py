"""Our tasks and encoders through `mteb.evaluate` with the released prompts (paper section 4.2), results cached in
mteb's layout keyed by a `fingerprint` of weights and settings and by a hash of each task's data; an offline task keeps
every query's nDCG@10. Importing it imports mteb (about 240 MB): the rest of the package imports it inside functions."""

from __future__ import annotations

import functools
import hashlib
import json
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.models.abs_encoder import AbsEncoder
from mteb.models.model_meta import ModelMeta, ScoringFunction

from ..files import file_digest
from ..prompts import C2LLM_PROMPTS, OFFLINE_TASKS, prompts
from ..retrieval import RetrievalTask
from .encoding import EncodingCache
from .scoring import bm25_query_scores, bm25_scores
from .tasks import instruction_overrides, task_prompts

QUERY_SCORES = "ndcg_at_10_per_query"  # an offline task's result: {query id: nDCG@10} (OfflineTask)
PROMPTED_TASKS = tuple(sorted({*C2LLM_PROMPTS, *OFFLINE_TASKS}))  # every task a prompt style has prompts for


def fingerprint(
    encoder, max_length: int | None = None, overrides: dict[str, str] | None = None, batch_size: int | None = None
) -> str:
    """A short hash of the encoder's weights (`weights_digest`, and the head, LoRA and first query projection in memory)
    and of every setting that changes its scores, used as mteb's revision so a changed model is never read from
    cache."""
    base = getattr(encoder, "encoder", encoder)  # a Truncated view hashes its encoder and its width
    config = base.config
    settings = {
        "config": config.to_dict(),
        "dtype": str(next(base.base_model.parameters()).dtype),
        "embedding_dim": getattr(encoder, "embedding_dim", None),
        "max_length": max_length,
        "batch_size": batch_size,
        "overrides": dict(sorted((overrides or {}).items())),
        "prompts": {t: prompts(config.prompt_style, t, config.document_prefix) for t in PROMPTED_TASKS},
        "folder": weights_digest(base),
    }
    digest = hashlib.blake2b(digest_size=8)
    digest.update(json.dumps(settings, sort_keys=True).encode())
    tensors = dict(base.pooler.state_dict())
    tensors.update(
        {k: v for k, v in base.backbone.state_dict().items() if "lora_" in k or "layers.0.self_attn.q_proj" in k}
    )
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(tensors[key].detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


_FOLDER_DIGESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loaded backbone -> weights_digest


def weights_digest(encoder) -> str | None:
    """`files.file_digest` of the folder `encoder` was loaded from (None if built in memory)."""
    directory = getattr(encoder, "directory", None)
    if directory is None:
        return None
    if encoder.backbone not in _FOLDER_DIGESTS:
        _FOLDER_DIGESTS[encoder.backbone] = file_digest(directory)
    return _FOLDER_DIGESTS[encoder.backbone]


def task_fingerprint(task: RetrievalTask) -> str:
    """A short hash of a task's queries, corpus and qrels (ids, texts, grades, in order)."""
    content = [task.queries, task.corpus, task.qrels]
    return hashlib.blake2b(json.dumps(content, ensure_ascii=False).encode(), digest_size=8).hexdigest()


class MTEBEncoder(AbsEncoder):
    """mteb's encoder protocol around a C2LLMEncoder with its prompt style's prompts; `prompts` overrides named tasks'
    query instructions (an unknown task gets its override, or in the c2llm style none). A shared `cache`
    (`EncodingCache`) encodes each text once. Its ModelMeta's revision is the `fingerprint`."""

    def __init__(
        self,
        encoder,
        prompts: dict[str, str] | None = None,
        batch_size: int = 16,
        max_length: int = 2048,
        name: str = "local/c2llm-reproduction",
        cache: EncodingCache | None = None,
    ) -> None:
        self.model = encoder
        self.overrides = dict(prompts or {})
        self.batch_size, self.max_length = batch_size, max_length
        self.cache = cache
        self.mteb_model_meta = ModelMeta.create_empty(
            overwrites={
                "name": name,
                "revision": fingerprint(encoder, max_length, self.overrides, batch_size),
                "embed_dim": encoder.embedding_dim,
                "max_tokens": max_length or encoder.config.max_length,
                "similarity_fn_name": ScoringFunction.COSINE,
                "use_instructions": True,
                "framework": ["PyTorch", "Transformers"],
                "open_weights": True,
            }
        )

    def task_prompts(self, task: str) -> tuple[str, str]:
        """(query instruction, document prefix) for a task name."""
        return task_prompts(self.model.config, task, self.overrides)

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs) -> np.ndarray:
        from mteb.types import PromptType

        texts = [text for batch in inputs for text in batch["text"]]
        query, document = self.task_prompts(task_metadata.name)
        kind, instruction = ("query", query) if prompt_type == PromptType.query else ("document", document)
        encode = self.model.encode if self.cache is None else functools.partial(self.cache.encode, self.model)
        return encode(texts, kind=kind, instruction=instruction, batch_size=self.batch_size, max_length=self.max_length)


class OfflineTask(AbsTaskRetrieval):
    """Base of the offline tasks (one subclass per task); results keep every query's nDCG@10."""

    task: RetrievalTask

    def task_specific_scores(self, scores, qrels, results, hf_split, hf_subset) -> dict[str, Any]:
        """{QUERY_SCORES: {query id: nDCG@10}}, pytrec_eval's values, kept in the cached result."""
        return {QUERY_SCORES: {q: float(s["ndcg_cut_10"]) for q, s in scores.items()}}

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        from datasets import Dataset
        from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

        split = RetrievalSplitData(
            queries=Dataset.from_list([{"id": q, "text": t} for q, t in self.task.queries.items()]),
            corpus=Dataset.from_list([{"id": d, "text": t, "title": ""} for d, t in self.task.corpus.items()]),
            relevant_docs=self.task.qrels,
            top_ranked=None,
        )
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True


def offline_task(task: RetrievalTask) -> OfflineTask:
    """An mteb task for one of our offline tasks; its dataset revision is the task's `task_fingerprint`."""
    from mteb.abstasks.task_metadata import TaskMetadata

    metadata = TaskMetadata(
        name=task.name,
        description=f"Offline held-out retrieval task {task.name} (c2llm_lib.eval.offline_tasks).",
        reference="https://arxiv.org/abs/2512.21332",
        dataset={"path": f"local/{task.name}", "revision": f"offline-{task_fingerprint(task)}"},
        type="Retrieval",
        category="t2t",
        modalities=["text"],
        eval_splits=["test"],
        eval_langs=["eng-Latn", "python-Code", "javascript-Code"],
        main_score="ndcg_at_10",
        date=("2024-01-01", "2024-12-31"),
        domains=["Programming"],
        task_subtypes=["Code retrieval"],
        license="not specified",
        annotations_creators="derived",
        dialect=[],
        sample_creation="found",
        bibtex_citation="",
    )
    name = "Offline_" + "".join(c if c.isalnum() else "_" for c in task.name)
    return type(name, (OfflineTask,), {"metadata": metadata, "task": task})()


def run_mteb(model: MTEBEncoder, tasks: Sequence[Any], cache_dir: str | Path) -> dict[str, float]:
    """{task: nDCG@10} through mteb.evaluate, cached under `cache_dir`; stale results are recomputed."""
    import mteb

    cache = mteb.ResultCache(cache_dir)
    stale = stale_results(cache, model.mteb_model_meta, tasks)
    scores = {}
    for chosen, strategy in (([t for t in tasks if id(t) not in stale], "only-missing"),
                             ([t for t in tasks if id(t) in stale], "always")):  # fmt: skip
        if chosen:
            result = mteb.evaluate(model, chosen, cache=cache, overwrite_strategy=strategy, show_progress_bar=False)
            scores.update({r.task_name: float(r.get_score()) for r in result.task_results})
    return scores


def stale_results(cache, meta, tasks: Sequence[Any]) -> set[int]:
    """Ids of tasks cached for `meta` on another dataset revision or without per-query scores."""
    stale = set()
    for task in tasks:
        found = cache.load_task_result(task.metadata.name, meta)
        if found is not None and found.dataset_revision != task.metadata.revision:
            stale.add(id(task))
        elif found is not None and isinstance(task, OfflineTask) and _query_scores(found) is None:
            stale.add(id(task))
    return stale


def _query_scores(result) -> dict[str, float] | None:
    """The per-query nDCG@10 a cached offline result holds (its test split, one subset), or None."""
    for split in result.scores.values():
        for subset in split:
            if isinstance(subset.get(QUERY_SCORES), dict):
                return {str(q): float(v) for q, v in subset[QUERY_SCORES].items()}
    return None


def cached_query_scores(model: MTEBEncoder, tasks: Sequence[Any], cache_dir: str | Path) -> dict[str, dict[str, float]]:
    """{task: {query id: nDCG@10}} from `run_mteb`'s cache, no encoding; a missing one raises LookupError (run
    `evaluate_all` with the same arguments first)."""
    import mteb

    cache = mteb.ResultCache(cache_dir)
    meta = model.mteb_model_meta
    out = {}
    for task in tasks:
        found = cache.load_task_result(task.metadata.name, meta)
        per_query = _query_scores(found) if found is not None else None
        if found is None or found.dataset_revision != task.metadata.revision or per_query is None:
            raise LookupError(f"{cache_dir}: no current per-query result of {meta.name} (revision {meta.revision}) on "
                              f"{task.metadata.name}; evaluate it first (run_mteb, evaluate_all)")  # fmt: skip
        out[task.metadata.name] = per_query
    return out


def evaluate_all(
    models: dict[str, Any],
    tasks: Sequence[RetrievalTask],
    cache_dir: str | Path,
    bm25: bool = True,
    batch_size: int = 16,
    max_length: int = 2048,
    log=print,
) -> dict[str, dict[str, float]]:
    """{model: {task: nDCG@10}} through mteb (cached), BM25 by our scorer; one `EncodingCache` shared."""
    cache = EncodingCache(list(models.values()))  # every model registered first, so siblings share each pass

    def evaluated(label: str, model: MTEBEncoder, offline: list[OfflineTask]) -> dict[str, float]:
        found = run_mteb(model, offline, cache_dir)
        log(f"evaluated {label}")
        return found

    return _per_model(models, tasks, bm25_scores if bm25 else None, evaluated, batch_size, max_length, cache)


def _per_model(models, tasks, bm25_scorer, score, batch_size: int, max_length: int, cache=None) -> dict[str, Any]:
    """{"BM25": bm25_scorer(tasks)} unless None, then {label: score(label, mteb model, offline tasks)}."""
    out: dict[str, Any] = {}
    if bm25_scorer is not None:
        out["BM25"] = bm25_scorer(tasks)
    for label, encoder in models.items():
        model = mteb_model(label, encoder, tasks, batch_size, max_length, cache)
        out[label] = score(label, model, [offline_task(t) for t in tasks])
    return out


def mteb_model(label: str, encoder, tasks: Sequence[RetrievalTask], batch_size: int, max_length: int, cache=None):
    """The `MTEBEncoder` named `local/<label slug>` with the tasks' instruction overrides."""
    slug = "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-")
    return MTEBEncoder(encoder, instruction_overrides(encoder.config, tasks), batch_size=batch_size,
                       max_length=max_length, name=f"local/{slug}", cache=cache)  # fmt: skip


def query_scores(
    models: dict[str, Any],
    tasks: Sequence[RetrievalTask],
    cache_dir: str | Path,
    bm25: bool = True,
    batch_size: int = 16,
    max_length: int = 2048,
) -> dict[str, dict[str, dict[str, float]]]:
    """{model: {task: {query id: nDCG@10}}} behind `evaluate_all`'s scores, read from its cache (a missing one
    raises LookupError: run `evaluate_all` with the same arguments first)."""

    def read(label: str, model: MTEBEncoder, offline: list[OfflineTask]) -> dict[str, dict[str, float]]:
        return cached_query_scores(model, offline, cache_dir)

    return _per_model(models, tasks, bm25_query_scores if bm25 else None, read, batch_size, max_length)
