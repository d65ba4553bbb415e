"""MTEB(Code, v1) through mteb itself, with the released prompts (paper section 4.2, table 2).

Users compare our numbers with the public leaderboard, so the evaluation is the leaderboard's own
code (`mteb.evaluate`), not a re-implementation:
- `MTEBEncoder`: an mteb encoder around `C2LLMEncoder`, with a `ModelMeta`, left padding, max length 2048
  at inference, and the prompts of the encoder's prompt style (`prompts.py`; for C2LLM, mteb's registration:
  table 1's instruction and a newline before queries, "Retrieved Answer:" before documents).
- `EncodingCache`: the models of one evaluation embed each formatted text once: a text shared by two tasks, or
  a `Truncated` view of an evaluated encoder, costs no second forward, and encoders on one backbone object
  (the untrained mean and last-token baselines) share one backbone pass per text (`shared_forward`: the EOS
  that last-token pooling appends comes last, and causal attention leaves the states before it unchanged).
  Scores equal each model's own `mteb.evaluate` (tests/test_eval_cache.py).
- `offline_task`: our offline retrieval tasks as in-memory `AbsTaskRetrieval`s, so that they run through
  `mteb.evaluate` exactly like the real benchmark. A task's dataset revision is a hash of its queries, corpus and
  qrels (`task_fingerprint`): `eval_limit` or `eval_max_documents` keep a task's name but change what it ranks.
  Its cached result also keeps every query's nDCG@10 (`QUERY_SCORES`, pytrec_eval's values that mteb averages), and
  `cached_query_scores` reads them back for the paired bootstrap (`uncertainty.py`) without encoding again.
- `run_mteb`: evaluates tasks with results cached under a folder in mteb's own layout
  (`ResultCache`); tasks already there are not rerun. The cache is keyed by the model's name and revision, and
  the revision is a `fingerprint` of the weights (every file of the model's folder) and of every setting that changes
  a score (max length, batch size, prompts, dtype, width), so a changed setting is a new computation, never a stale
  score. mteb files one result per model and task name whatever the task's data, so a cached result whose dataset
  revision is not the task's (another `eval_limit`, a changed mirror) is computed again and replaced, never read.
- `mteb_task_sizes`: queries and documents of each benchmark task (mteb's statistics), for the results table;
- `comparison_table`: our per-task nDCG@10 beside table 2 and the reference scores, with the full mean and
  a contamination-clean mean. The clean mean leaves out CodeEditSearch, which is evaluated on its train
  split, the split C2LLM trained on.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.models.abs_encoder import AbsEncoder

from .batching import length_batches
from .data.sources import mirrored_task, mteb_tasks
from .files import file_digest
from .model import C2LLMEncoder
from .model.encoder import _check_texts
from .prompts import C2LLM_PROMPTS, OFFLINE_TASKS, prompts
from .retrieval import RetrievalTask, Truncated, truncate

MTEB_CODE_V1 = (
    "AppsRetrieval", "CodeEditSearchRetrieval", "CodeFeedbackMT", "CodeFeedbackST", "CodeSearchNetCCRetrieval",
    "CodeSearchNetRetrieval", "CodeTransOceanContest", "CodeTransOceanDL", "COIRCodeSearchNetRetrieval", "CosQA",
    "StackOverflowQA", "SyntheticText2SQL",
)  # fmt: skip
CONTAMINATED = ("CodeEditSearchRetrieval",)  # evaluated on its train split
QUERY_SCORES = "ndcg_at_10_per_query"  # an offline task's result: {query id: nDCG@10} (OfflineTask)
PROMPTED_TASKS = tuple(sorted({*C2LLM_PROMPTS, *OFFLINE_TASKS}))  # every task a prompt style has prompts for
# nDCG@10 x 100 from the public MTEB results (reference section 5); C2LLM rows equal the paper's table 2.
REFERENCE_SCORES = {
    "C2LLM-7B (paper)": (86.71, 81.49, 94.32, 90.66, 97.90, 91.07, 92.51, 34.13, 89.79, 39.76, 94.85, 75.75),
    "C2LLM-0.5B (paper)": (61.02, 71.39, 92.29, 88.63, 96.29, 89.20, 84.27, 33.99, 86.71, 38.30, 89.40, 74.08),
    "Qwen3-Embedding-0.6B": (75.34, 64.42, 90.82, 86.39, 91.72, 91.01, 86.05, 31.36, 84.69, 36.48, 89.99, 76.74),
    "BM25 (bm25s)": (4.76, 49.85, 59.19, 68.15, 53.97, 60.01, 47.78, 34.42, 40.86, 18.75, 70.26, 24.94),
}  # in MTEB_CODE_V1 order


def fingerprint(
    encoder, max_length: int | None = None, overrides: dict[str, str] | None = None, batch_size: int | None = None
) -> str:
    """A short hash of every setting that changes an encoder's scores: its config (pooling, prompt style,
    document prefix, ...), the dtype its backbone computes in (what `dtype: auto` resolved to), the embedding width (a
    Truncated view's), the evaluation's `max_length` and `batch_size` (in bf16 an embedding moves with the padding of
    its batch), the query instruction `overrides`, the prompts its style gives every known task, and the weights: every
    file of the folder the encoder was loaded from (`weights_digest`: backbone, adapter, head, tokenizer, configs), and
    the tensors that training or a merge change in memory (PMA head, LoRA, the first layer's query projection; all an
    encoder built in memory has besides the backbone its config names). mteb caches results by model name and
    revision, so a retrained model, or the same model evaluated differently, under the same name must get a new
    revision, never the old scores."""
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
    """`files.file_digest` of the folder `encoder` was loaded from (`C2LLMEncoder.directory`: a run's `merged/`, a
    release), every file of it, read once per loaded backbone (about 1 GB for the 0.5B model; the baselines' poolers
    share one); None for an encoder built in memory (the untrained baselines of a run, the ablations' variants)."""
    directory = getattr(encoder, "directory", None)
    if directory is None:
        return None
    if encoder.backbone not in _FOLDER_DIGESTS:
        _FOLDER_DIGESTS[encoder.backbone] = file_digest(directory)
    return _FOLDER_DIGESTS[encoder.backbone]


def task_fingerprint(task: RetrievalTask) -> str:
    """A short hash of what a retrieval task ranks: its queries, its corpus and its qrels (ids, texts, grades, in
    order). Two tasks of one name (the offline tasks under another `eval_limit` or `eval_max_documents`) share it
    only when they score the same."""
    content = [task.queries, task.corpus, task.qrels]
    return hashlib.blake2b(json.dumps(content, ensure_ascii=False).encode(), digest_size=8).hexdigest()


def model_meta(
    encoder,
    name: str = "local/c2llm-reproduction",
    revision: str | None = None,
    max_length: int | None = None,
    overrides: dict[str, str] | None = None,
    batch_size: int | None = None,
):
    """A ModelMeta for our encoder (mteb needs one, or it substitutes an empty record and tries the hub); its
    revision is the `fingerprint` of the encoder and of the evaluation settings unless given."""
    from mteb.models.model_meta import ModelMeta, ScoringFunction

    return ModelMeta.create_empty(
        overwrites={
            "name": name,
            "revision": revision or fingerprint(encoder, max_length, overrides, batch_size),
            "embed_dim": encoder.embedding_dim,
            "max_tokens": max_length or encoder.config.max_length,
            "similarity_fn_name": ScoringFunction.COSINE,
            "use_instructions": True,
            "framework": ["PyTorch", "Transformers"],
            "open_weights": True,
        }
    )


def task_prompts(config, task: str, overrides: dict[str, str] | None = None) -> tuple[str, str]:
    """(query instruction, document prefix) that `MTEBEncoder` gives a task, for an encoder's ModelConfig."""
    overrides = overrides or {}
    try:
        query, document = prompts(config.prompt_style, task, config.document_prefix)
    except ValueError:
        if task not in overrides and config.prompt_style != "c2llm":
            raise
        query, document = "", config.document_prefix
    return overrides.get(task, query), document


def shared_forward(encoders: Sequence[Any], texts: Sequence[str], max_length: int, batch_size: int = 16):
    """Unnormalised float32 embeddings, one (N, d_i) array per encoder, of `texts` (already formatted: instruction
    or document prefix included) for encoders that share one backbone and tokenizer object (the untrained
    baselines), from one backbone pass per text where their token sequences allow it.

    An encoder that appends EOS (last-token pooling) reads `text[:max_length - 1] + [EOS]`, one without EOS (mean,
    PMA) reads `text[:max_length]`. When the text has fewer than `max_length` tokens both are prefixes of
    `text + [EOS]`, and since attention is causal the hidden states of the earlier tokens do not depend on the EOS
    after them: one pass serves both, the encoder without EOS pooling over all tokens but the last. A text of
    `max_length` tokens or more is cut differently for the two, and each gets its own pass. Returns the arrays and
    the number of sequences that went through the backbone."""
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
    """Embeddings computed once per (encoder, max length, formatted text) during one evaluation (`evaluate_all`).

    A formatted text (the instruction or document prefix joined to the text) determines an encoder's tokens, so it
    is the key: the same document in two tasks, or a second model reading the same embeddings, costs no second
    forward. Encoders registered with `add` that share one backbone and tokenizer object (`eval.baselines` builds
    the untrained poolers that way) are computed together, one backbone pass per text (`shared_forward`). A
    `Truncated` view reads its encoder's full embeddings, cut to its width and re-normalised, as `Truncated.encode`
    does. Anything else is passed through to its own `encode`. Memory: N x d float32 per encoder and length.
    `sequences` counts the sequences that went through a backbone."""

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


class MTEBEncoder(AbsEncoder):
    """mteb's encoder protocol around a C2LLMEncoder, with the prompts of the encoder's `prompt_style`
    (`prompts.prompts`). `prompts` overrides the query instruction of named tasks. A task no prompt set knows
    (a custom task) gets its override or, in the c2llm style, no instruction, as mteb does for a model whose
    prompts lack the task; its documents get the encoder's `document_prefix`. With a `cache` (`EncodingCache`,
    shared by the models of one evaluation) texts already embedded are not encoded again."""

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
        self.mteb_model_meta = model_meta(encoder, name, max_length=max_length, overrides=self.overrides,
                                          batch_size=batch_size)  # fmt: skip

    def task_prompts(self, task: str) -> tuple[str, str]:
        """(query instruction, document prefix) for a task name."""
        return task_prompts(self.model.config, task, self.overrides)

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs) -> np.ndarray:
        from mteb.types import PromptType

        texts = [text for batch in inputs for text in batch["text"]]
        query, document = self.task_prompts(task_metadata.name)
        kind, instruction = ("query", query) if prompt_type == PromptType.query else ("document", document)
        settings = {
            "kind": kind,
            "instruction": instruction,
            "batch_size": self.batch_size,
            "max_length": self.max_length,
        }
        if self.cache is not None:
            return self.cache.encode(self.model, texts, **settings)
        return self.model.encode(texts, **settings)


class OfflineTask(AbsTaskRetrieval):
    """Base of the offline tasks: mteb keeps task metadata on the class, so `offline_task` makes one small
    subclass per task, carrying its metadata and its in-memory data. Its results also hold every query's nDCG@10
    (`QUERY_SCORES`), for the paired bootstrap of `uncertainty.py`."""

    task: RetrievalTask

    def task_specific_scores(self, scores, qrels, results, hf_split, hf_subset) -> dict[str, Any]:
        """{QUERY_SCORES: {query id: nDCG@10}}: pytrec_eval's per-query values, the ones mteb averages into
        `ndcg_at_10`, kept in the result mteb caches (so a result read back brings them, with no encoding)."""
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
    """An mteb task for one of our offline retrieval tasks (`eval.offline_tasks`); its dataset revision is the
    `task_fingerprint` of its content, which mteb records with every result (`run_mteb` compares them)."""
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
    """{task: nDCG@10} through mteb.evaluate; results are cached in mteb's layout under `cache_dir`, and a task
    already there is read back instead of rerun, unless that result was computed on other data than the task holds
    now (`stale_results`): then it is computed again, and its file replaced."""
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
    """The ids of the tasks for which `cache` holds a result of this model (`meta`: name and revision) on another
    dataset revision than the task's: mteb's "only-missing" would read it back, whatever data it was computed on. An
    offline task's result without per-query scores (`QUERY_SCORES`, cached before they were kept) is stale too."""
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
    """{task: {query id: nDCG@10}} of `model` on offline tasks that `run_mteb` evaluated into `cache_dir`: the per-query
    values behind each cached score, read back without encoding. A task with no current result (not evaluated, another
    dataset revision, no per-query scores) is an error naming the model and the task."""
    import mteb

    cache = mteb.ResultCache(cache_dir)
    meta = model.mteb_model_meta
    out = {}
    for task in tasks:
        found = cache.load_task_result(task.metadata.name, meta)
        per_query = _query_scores(found) if found is not None else None
        if found is None or found.dataset_revision != task.metadata.revision or per_query is None:
            raise LookupError(f"{cache_dir}: no current per-query result of {meta.name} (revision {meta.revision}) on "
                              f"{task.metadata.name}; evaluate it first (run_mteb, eval.evaluate_all)")  # fmt: skip
        out[task.metadata.name] = per_query
    return out


def mteb_code_tasks(names: Sequence[str] | None = None, mirror: str | Path | None = None):
    """MTEB(Code, v1) tasks (all 12, or the named subset); their data comes from the hub, or from a local mirror
    folder laid out as the hub datasets (`data/mirror.py`)."""
    names = list(names or MTEB_CODE_V1)
    unknown = sorted(set(names) - set(MTEB_CODE_V1))
    if unknown:
        raise ValueError(f"{unknown} are not MTEB(Code, v1) tasks; choose from {list(MTEB_CODE_V1)}")
    return mteb_tasks(names, mirror)


DEFAULT_BENCHMARKS = ("MTEB(Code, v1)",)
# Public scores (main score x 100, mean over the benchmark's tasks) of benchmarks other than MTEB(Code, v1), shown
# beside ours; MTEB(Code, v1) has per-task figures in REFERENCE_SCORES.
PUBLIC_MEANS = {
    "CoREB(v1)": {
        "source": "figures quoted in this repository's issue 15 for CoREB(v1) (built to limit training-data "
        "contamination; Xue et al. 2026, arXiv:2605.04615); not re-checked against the leaderboard here",
        "scores": {"C2LLM-7B": 60.10, "C2LLM-0.5B": 58.08, "Qwen3-Embedding-0.6B": 54.07},
    },
}


def available_benchmarks() -> list[str]:
    """Names of the benchmarks the installed mteb ships (`mteb.get_benchmarks()`)."""
    import mteb

    return sorted(b.name for b in mteb.get_benchmarks())


def check_benchmarks(names: Sequence[str], key: str = "benchmarks") -> None:
    """Raises, naming `key`, unless every name is a benchmark of the installed mteb (listing those it has)."""
    import difflib

    available = available_benchmarks()
    for name in names:
        if name in available:
            continue
        close = difflib.get_close_matches(name, available, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if name.count("(") != name.count(")"):
            hint += "; a name with a comma must be quoted in YAML: --set 'benchmarks=[\"MTEB(Code, v1)\"]'"
        raise ValueError(
            f"{key}: {name!r} is not a benchmark of the installed mteb {_mteb_version()}{hint}. "
            f"Available: {', '.join(available)}"
        )


def _mteb_version() -> str:
    from importlib.metadata import version

    return version("mteb")


def benchmark_tasks(name: str, tasks: Sequence[str] = ("all",), mirror: str | Path | None = None) -> list:
    """The mteb task objects of benchmark `name` (all of them, or those named in `tasks`), as mteb's registry
    describes them (no download); their data comes from the hub, or from a local mirror (`data/mirror.py`)."""
    import mteb

    check_benchmarks([name])
    chosen = list(mteb.get_benchmark(name).tasks)
    if list(tasks) != ["all"]:
        chosen = [t for t in chosen if t.metadata.name in set(tasks)]
    return chosen if mirror is None else [mirrored_task(t, mirror) for t in chosen]


def select_tasks(benchmarks: Sequence[str], tasks: Sequence[str]) -> dict[str, list[str]]:
    """{benchmark: the names of its tasks to run}: all of them for `tasks == ["all"]`, else those named; a task name
    in none of the benchmarks is an error naming the key `mteb_tasks`."""
    import mteb

    check_benchmarks(benchmarks)
    members = {b: [t.metadata.name for t in mteb.get_benchmark(b).tasks] for b in benchmarks}
    if list(tasks) == ["all"]:
        return members
    known = {t for names in members.values() for t in names}
    unknown = sorted(set(tasks) - known)
    if unknown:
        raise ValueError(f"mteb_tasks: {unknown} are in none of the benchmarks {list(benchmarks)}; ['all'] runs all")
    return {b: [t for t in names if t in set(tasks)] for b, names in members.items() if set(names) & set(tasks)}


def benchmark_table(benchmark: str, ours: dict[str, float], label: str = "this run"):
    """Ours (main scores in [0, 1]) x 100 with the mean over tasks, beside the public figures: per task for
    MTEB(Code, v1) (`comparison_table`), the public means of `PUBLIC_MEANS` for the others (blank per task)."""
    import pandas as pd

    if benchmark == "MTEB(Code, v1)":
        return comparison_table(ours, label)
    frame = pd.DataFrame({label: {t: 100 * v for t, v in ours.items()}}).T
    frame["mean"] = frame.mean(axis=1)
    public = PUBLIC_MEANS.get(benchmark, {}).get("scores", {})
    rows = [pd.DataFrame({"mean": [score]}, index=[f"{model} (public)"]) for model, score in public.items()]
    return pd.concat([*rows, frame]).round(2)


def evaluate_benchmarks(
    model: MTEBEncoder,
    benchmarks: Sequence[str],
    tasks: Sequence[str],
    cache_dir: str | Path,
    mirror: str | Path | None = None,
    label: str = "this run",
) -> dict[str, dict[str, Any]]:
    """{benchmark: {"table": `benchmark_table`, "sizes": `mteb_task_sizes`}} of each named mteb benchmark through
    `run_mteb` (results cached as for every evaluation); `tasks` as in `select_tasks`."""
    results = {}
    for benchmark, names in select_tasks(benchmarks, tasks).items():
        chosen = benchmark_tasks(benchmark, names, mirror)
        scores = run_mteb(model, chosen, cache_dir)
        results[benchmark] = {"table": benchmark_table(benchmark, scores, label), "sizes": mteb_task_sizes(chosen)}
    return results


def public_sources(benchmarks: Sequence[str]) -> str:
    """The sources of the public figures shown for these benchmarks, one line each."""
    lines = ["- MTEB(Code, v1): public MTEB results; the C2LLM rows equal the paper's table 2."] * (
        "MTEB(Code, v1)" in benchmarks
    )
    lines += [f"- {b}: {PUBLIC_MEANS[b]['source']}." for b in benchmarks if b in PUBLIC_MEANS]
    return "\n".join(lines)


SIZES_NOTE = (
    "Queries and documents per task: mteb's statistics of the evaluated split, summed over a task's subsets "
    "(a query ranks against its own subset's documents)."
)


def mteb_task_sizes(tasks: Sequence[Any]) -> dict[str, dict[str, int]]:
    """{task: {"queries": n, "documents": m}} of mteb tasks, from mteb's descriptive statistics (no download);
    a task without statistics is left out."""
    sizes = {}
    for task in tasks:
        stats = (task.metadata.descriptive_stats or {}).get(task.metadata.eval_splits[0]) or {}
        queries, documents = stats.get("num_queries"), stats.get("num_documents")
        relevant = stats.get("relevant_docs_statistics") or {}
        if queries is None and relevant.get("average_relevant_docs_per_query"):  # older statistics: derive them
            queries = round(relevant["num_relevant_docs"] / relevant["average_relevant_docs_per_query"])
            documents = stats["num_samples"] - queries if "num_samples" in stats else None
        if queries is not None and documents is not None:
            sizes[task.metadata.name] = {"queries": int(queries), "documents": int(documents)}
    return sizes


def comparison_table(ours: dict[str, float], label: str = "this run"):
    """Ours (nDCG@10 in [0, 1]) beside the reference rows, x 100, with full and contamination-clean means."""
    import pandas as pd

    rows = {name: dict(zip(MTEB_CODE_V1, scores, strict=True)) for name, scores in REFERENCE_SCORES.items()}
    rows[label] = {t: 100 * ours[t] for t in MTEB_CODE_V1 if t in ours}
    frame = pd.DataFrame(rows).T[[t for t in MTEB_CODE_V1 if t in ours] or list(MTEB_CODE_V1)]
    frame["mean"] = frame.mean(axis=1)
    clean = [t for t in frame.columns if t not in CONTAMINATED and t != "mean"]
    frame["mean without CodeEditSearch"] = frame[clean].mean(axis=1)
    return frame.round(2)
