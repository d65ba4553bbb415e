"""Retrieval evaluation (paper section 4.2: nDCG@10 on MTEB(Code) retrieval tasks).

This module holds the pieces every evaluation shares and drives the evaluation; it imports `mteb_code` (the mteb
adapter), never the other way round (the pieces both need, `RetrievalTask`, `corpus_text` and `truncate`, live in
`retrieval.py` and are re-exported here):
- `RetrievalTask`: queries, a corpus and graded relevance (qrels), in mteb's shape;
- `offline_tasks`: tasks built from the held-out split of the offline real-code dataset (one per
  (recipe, language)) and from HumanEval. Every held-out positive is in the corpus, also when `limit`
  caps the queries (a sample drawn with a seed across the whole task, `drawn_queries`, never its first rows), so
  each query competes against all held-out documents of its task (or, with `max_documents`, for a CPU budget:
  every positive of the evaluated queries and a fixed seeded sample of the other documents; `limit_task` does both,
  for any task); `task_sizes` counts queries (drawn of how many, with which seed) and documents, and with an encoder
  how many of them its evaluation length cuts (`truncation_counts`), which every results table shows with that
  length (`results_markdown`);
- `heldout_tasks`: the same tasks built from a run's own held-out split (`data/heldout` of a `files` or `code` run),
  one per (dataset, language) group: `heldout-text2code-<language>` and `heldout-code2code-<language>` for code,
  `heldout-<group>-<language>` for a user's files; a query repeated with several positives is one query with all of
  them relevant. No HumanEval beside them: it measures the offline recipe, not the user's data. `evaluation_tasks`
  picks the run's tasks (its own held-out split when it has one, else the offline ones);
- `unseen_tasks`: two tasks per library of `unseen_packages` (`data/unseen.py`: pinned PyPI wheels no training row
  came from), `unseen-text2code-<package>` and `unseen-code2code-<package>`, each ranking its queries against the
  package's whole corpus (every function, documented or not, as a document);
- `contamination_note`: the evaluated sets a run's training rows were not decontaminated against (notebook 01 checks
  the held-out tasks always, the unseen libraries it records, MTEB(Code, v1) only with `decontaminate_mteb`, never a
  BEIR set), said beside the scores;
- `instruction_overrides`: in the c2llm prompt style, a task whose instruction is its own (a user's files' groups,
  a local BEIR set, `data/beir.py`) is evaluated with that instruction, as its rows trained;
- `chunked_topk`: exact top-k by cosine over a corpus scored in chunks. Memory is bounded by
  queries x chunk plus queries x k, never queries x corpus, because a CodeSearchNet corpus has about
  1M documents;
- `ndcg_at_k` and `recall_at_k` on ranked ids (binary or graded relevance, the standard log2 discount);
- `evaluate_encoder` and `evaluate_bm25` (bm25s), scored the same way; `evaluate_all` runs encoders through
  `mteb.evaluate` (cached, resumable; within one call no model encodes a text twice, and the baselines share one
  backbone pass per text: `mteb_code.EncodingCache`) and BM25 through this scorer; `task_embeddings` and
  `truncation_scores` score one encoding pass at several truncated widths (the dimension sweeps).
  Every score is a mean of per-query nDCG@10, and the per-query values are there for the paired bootstrap
  (`uncertainty.py`): `query_scores` reads those of `evaluate_all`'s models from mteb's cache (no second encoding)
  and scores BM25's; `bm25_query_scores`, `embedding_query_scores` and `truncation_query_scores` give the others.
  `baselines` builds the untrained-pooler baselines on the evaluated model's own backbone (a released
  checkpoint's through `C2LLMEncoder.from_released`), loaded once and shared by the poolers. `scored_table` is one
  table of notebook 04 in one call: scores, sizes, per-query scores, the trained model's differences to the others
  with their intervals, and the markdown (the BEIR sets' and the unseen libraries' tables).
  Documents are prepared as mteb prepares a corpus (`corpus_text`: stripped), so our scores equal
  `mteb.evaluate`'s on the same task (tested in tests/test_mteb_code.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .data.negatives import bm25_scores_topk
from .data.offline import TEXT_TO_CODE, humaneval_records, load_snapshot
from .data.records import DataError
from .data.sources import TABLE_1
from .data.unseen import mine_packages, package_pins
from .model import C2LLMEncoder
from .model.released import is_released_checkpoint
from .prompts import HELDOUT_RECIPES, prompts, recipe_task
from .retrieval import RetrievalTask, corpus_text, file_safe, truncate
from .uncertainty import differences, differences_markdown


def limit_task(
    task: RetrievalTask, limit: int | None = None, max_documents: int | None = None, seed: int = 0
) -> RetrievalTask:
    """`task` with `limit` of its queries (all when None) and their qrels; the corpus keeps every document, so a
    limit shortens the query list and never the corpus. The queries are drawn with `seed` across the whole task
    (`drawn_queries`: the same on every run, whatever the order of the rows or files they came from), and kept in the
    task's order; the result records how many the task held (`split_queries`) and the seed. With `max_documents`, the
    corpus keeps every document judged for an evaluated query and a sample of the others (seeded by `seed` and the
    task name, so the same on every run) up to `max_documents`; documents keep their ids and order."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of queries or None, got {limit}")
    if max_documents is not None and max_documents < 1:
        raise ValueError(f"max_documents must be a positive number of documents or None, got {max_documents}")
    drawn = limit is not None and limit < len(task.queries)
    kept_queries = drawn_queries(task, limit, seed) if drawn else list(task.queries)
    queries = {q: task.queries[q] for q in kept_queries}
    qrels = {q: task.qrels[q] for q in kept_queries}
    corpus = task.corpus
    sampled = max_documents is not None and len(corpus) > max_documents
    if sampled:
        judged = {d for relevant in qrels.values() for d in relevant}
        distractors = [d for d in corpus if d not in judged]
        k = min(len(distractors), max(0, max_documents - len(judged)))
        kept = judged | set(random.Random(f"{seed}:{task.name}").sample(distractors, k))
        corpus = {d: text for d, text in corpus.items() if d in kept}
    return RetrievalTask(task.name, queries, corpus, qrels, task.instruction,
                         split_queries=len(task.queries) if drawn else task.split_queries,
                         seed=seed if drawn or sampled else task.seed)  # fmt: skip


def drawn_queries(task: RetrievalTask, limit: int, seed: int = 0) -> list[str]:
    """The ids of `limit` queries of `task` drawn with `seed`, in task order: those with the smallest hash of the seed,
    the query's text and its relevant documents' texts and grades (ties, a query repeated with the same answers, by
    id). A draw from the whole task that depends on its content only, never on the order of its rows: a limit takes a
    sample, not the first files' queries, and the same one on every run while the task is unchanged."""

    def key(q: str) -> tuple[str, str]:
        answers = sorted((task.corpus.get(d, d), grade) for d, grade in task.qrels.get(q, {}).items())
        blob = json.dumps([seed, task.queries[q], answers], ensure_ascii=False).encode()
        return hashlib.sha256(blob).hexdigest(), q

    chosen = set(sorted(task.queries, key=key)[:limit])
    return [q for q in task.queries if q in chosen]


def task_from_rows(
    name: str,
    rows: Sequence[dict],
    instruction: str,
    limit: int | None = None,
    max_documents: int | None = None,
    seed: int = 0,
    distinct_queries: bool = False,
    documents: Sequence[str] = (),
) -> RetrievalTask:
    """A task of the rows' queries, `limit` of them drawn with `seed` (all when None; `limit_task`); the corpus holds
    every row's positive and every text of `documents` (a whole corpus: the answers of no query too), so a limit
    shortens the query list and never the corpus. Identical documents share an id. With `distinct_queries`, rows
    sharing a query text are one query, relevant to each of their positives (a query's other correct answers are not
    counted as misses). `max_documents` as in `limit_task`."""
    corpus, ids, queries, qrels, query_ids = {}, {}, {}, {}, {}
    for text in [*(row["positive"] for row in rows), *documents]:
        doc_id = ids.setdefault(text, f"d{len(ids)}")
        corpus[doc_id] = text
    for i, row in enumerate(rows):
        query_id = query_ids.setdefault(row["query"], f"q{len(query_ids)}") if distinct_queries else f"q{i}"
        queries[query_id] = row["query"]
        qrels.setdefault(query_id, {})[ids[row["positive"]]] = 1
    return limit_task(RetrievalTask(name, queries, corpus, qrels, instruction), limit, max_documents, seed)


def offline_tasks(
    limit: int | None = None, include_humaneval: bool = True, max_documents: int | None = None, seed: int = 0
) -> list[RetrievalTask]:
    """Held-out offline tasks, one per (recipe, language), plus HumanEval; `limit` caps queries per task (drawn with
    `seed` across the task, `limit_task`), and
    every task's corpus holds all of its held-out documents, or with `max_documents` every positive of the
    evaluated queries and a seeded sample of the others up to that many (`task_from_rows`)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in load_snapshot():
        if row["split"] == "test":
            groups.setdefault((row["dataset"], row["language"]), []).append(row)
    tasks = []
    for (dataset, language), rows in sorted(groups.items()):
        short = {"CodeSearchNetRetrieval": "text2code", "CodeSearchNetCCRetrieval": "code2code"}[dataset]
        name = f"offline-{short}-{language}"
        tasks.append(task_from_rows(name, rows, TABLE_1[dataset], limit, max_documents, seed))
    if include_humaneval:
        tasks.append(
            task_from_rows("HumanEval", humaneval_records(), TABLE_1[TEXT_TO_CODE], limit, max_documents, seed)
        )
    return tasks


HELDOUT_COLUMNS = ("dataset", "language", "query", "positive", "instruction")


def heldout_task_names(groups: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """{(dataset, language): task name} of a run's held-out groups: `heldout-text2code-<language>` and
    `heldout-code2code-<language>` for the two code recipes (`prompts.HELDOUT_RECIPES`), `heldout-<group>-<language>`
    for a user's group (its name made file-safe; a group that would read as a code recipe's task is prefixed
    `files-`, and names that coincide get `-2`, `-3`, ...)."""
    short = {recipe: name for name, recipe in HELDOUT_RECIPES.items()}
    names: dict[tuple[str, str], str] = {}
    for dataset, language in sorted(set(groups)):
        if dataset in short:
            name = f"heldout-{short[dataset]}-{language}"
        else:
            name = f"heldout-{file_safe(dataset)}-{file_safe(language)}"
            if recipe_task(name) != name:
                name = f"heldout-files-{file_safe(dataset)}-{file_safe(language)}"
        base, n = name, 1
        while name in names.values():
            n += 1
            name = f"{base}-{n}"
        names[(dataset, language)] = name
    return names


def heldout_tasks(
    heldout, limit: int | None = None, max_documents: int | None = None, seed: int = 0
) -> list[RetrievalTask]:
    """Tasks from a run's held-out split (a `datasets.Dataset` or rows in the record schema, `data/heldout`), one per
    (dataset, language) group as `offline_tasks` builds them (`heldout_task_names`; `limit` and `max_documents` as in
    `limit_task`), each query once with all its positives relevant. A task's instruction is its rows' (the most
    frequent one where a files group's rows differ); an empty split is an error."""
    rows = heldout.select_columns(list(HELDOUT_COLUMNS)).to_list() if hasattr(heldout, "select_columns") else heldout
    missing = sorted(set(HELDOUT_COLUMNS) - set(rows[0])) if rows else []
    if not rows or missing:
        raise DataError(f"the held-out split has {'no rows' if not rows else f'no column {missing}'}: "
                        "rebuild it with notebook 01")  # fmt: skip
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["dataset"], row["language"]), []).append(row)
    names = heldout_task_names(groups)
    tasks = []
    for group, members in sorted(groups.items(), key=lambda item: names[item[0]]):
        instruction = Counter(r["instruction"] for r in members).most_common(1)[0][0]
        tasks.append(task_from_rows(names[group], members, instruction, limit, max_documents, seed,
                                    distinct_queries=True))  # fmt: skip
    return tasks


def evaluation_tasks(
    heldout=None, limit: int | None = None, max_documents: int | None = None, seed: int = 0
) -> list[RetrievalTask]:
    """The tasks notebook 04 evaluates a run on: its own held-out split's (`heldout_tasks`) when it has one (a
    `files` or `code` run), else the offline snapshot's held-out tasks and HumanEval (`offline_tasks`)."""
    if heldout is not None:
        return heldout_tasks(heldout, limit, max_documents, seed)
    return offline_tasks(limit, max_documents=max_documents, seed=seed)


def unseen_task_names(entries: Sequence[str]) -> dict[str, str]:
    """{task name: its package's pin} of the tasks `unseen_tasks` makes of `unseen_packages` (no fetching): what
    `contamination_note` compares with the pins notebook 01 recorded."""
    return {f"unseen-{short}-{file_safe(pin.name)}": str(pin) for pin in package_pins(entries)
            for short in HELDOUT_RECIPES}  # fmt: skip


def unseen_tasks(
    entries: Sequence[str],
    limit: int | None = None,
    max_documents: int | None = None,
    seed: int = 0,
    cache_dir: str | Path | None = None,
) -> list[RetrievalTask]:
    """Two tasks per library of `unseen_packages` (`data.unseen.mine_packages`: the pinned wheel, fetched once into
    the cache and hash-checked, mined): `unseen-text2code-<package>` and `unseen-code2code-<package>`, each query once
    with all its positives relevant, against the package's whole corpus (every function as a document, its queries'
    answers or not); `limit` and `max_documents` as in `limit_task`. No packages: no tasks."""
    tasks = []
    for mined in mine_packages(entries, cache_dir) if entries else []:
        for short, recipe in HELDOUT_RECIPES.items():
            tasks.append(task_from_rows(f"unseen-{short}-{file_safe(mined.pin.name)}", mined.rows[recipe],
                                        TABLE_1[recipe], limit, max_documents, seed, distinct_queries=True,
                                        documents=mined.corpus[recipe]))  # fmt: skip
    return tasks


def instruction_overrides(config, tasks: Sequence[RetrievalTask]) -> dict[str, str]:
    """{task: its own query instruction} for the tasks whose instruction the c2llm prompt set does not give: a
    user's files' groups and local BEIR sets (the offline and code held-out tasks' instructions are table 1's, the
    set's own). The c2llm style trains on each row's instruction, so it evaluates such a task with the task's; the
    peer styles evaluate with their own prompt sets, as they trained (`prompts.prompts`), and get none."""
    if config.prompt_style != "c2llm":
        return {}
    overrides = {}
    for task in tasks:
        try:
            query, _ = prompts("c2llm", task.name, config.document_prefix)
        except ValueError:
            query = None
        if query != task.instruction:
            overrides[task.name] = task.instruction
    return overrides


CHECKED_KEY = "decontaminated_mteb_tasks"  # notebook 01's record in metrics/data.json (data/build.py)


def contamination_note(
    evaluated: Sequence[str], data_record: dict | None, model: str, unseen: dict[str, str] | None = None
) -> str:
    """A paragraph naming the evaluated sets (task names, in order) that `model`'s training rows were not checked
    against, "" when there is none. `data_record` is the run's `metrics/data.json`: notebook 01 removes every text of
    the offline held-out split, HumanEval and the run's own held-out split from the rows, the texts of the unseen
    libraries whose pins it records (`unseen_packages`; `unseen` gives each unseen task's pin, `unseen_task_names`),
    and the test texts of the MTEB tasks it records (`CHECKED_KEY`; none unless `decontaminate_mteb`), never a local
    BEIR set's or another benchmark's; so any other set is named. None (a released checkpoint, whose training data this
    repository did not prepare) names every evaluated set, as does a record that predates the key."""
    evaluated = list(dict.fromkeys(evaluated))  # a task of two benchmarks, once
    unseen, recorded = unseen or {}, set((data_record or {}).get("unseen_packages", []))
    checked = [s for s in evaluated if _always_checked(s) or (s in unseen and unseen[s] in recorded)]
    if data_record is None:
        unchecked, why = list(evaluated), "its training data was not prepared here, so nothing was checked against it"
    elif not isinstance(data_record.get(CHECKED_KEY), list):
        unchecked = [s for s in evaluated if s not in checked]
        why = "metrics/data.json does not record which MTEB tasks notebook 01 decontaminated against (rerun 01)"
    else:
        unchecked = [s for s in evaluated if s not in checked and s not in data_record[CHECKED_KEY]]
        why = ("notebook 01 decontaminates only against MTEB(Code, v1)'s test sets, and only with decontaminate_mteb: "
               f"it checked {len(data_record[CHECKED_KEY])} MTEB tasks")  # fmt: skip
        if any(s in unseen for s in unchecked):
            why += ", and against the unseen libraries whose pins it records (unseen_packages)"
    if not unchecked:
        return ""
    return (f"**Not checked for contamination**: the training rows of {model} were not decontaminated against "
            f"{', '.join(unchecked)} ({why}); a score there may count texts the model trained on.\n")  # fmt: skip


def _always_checked(task: str) -> bool:
    """A task (named by this module) notebook 01 always decontaminates against: the offline held-out tasks, HumanEval,
    a run's own held-out tasks."""
    return task == "HumanEval" or task.startswith(("offline-", "heldout-"))


def task_sizes(
    tasks: Sequence[RetrievalTask], encoder=None, max_length: int | None = None
) -> dict[str, dict[str, int]]:
    """{task: {"queries": n, "documents": corpus size}}: what each score was ranked against; for a task whose queries a
    limit drew (`limit_task`), also "queries in the split" (how many it held) and "seed" (the draw's). With an
    `encoder` and the evaluation's `max_length`, also how many queries and documents were cut at that length
    (`truncation_counts`)."""
    sizes = {t.name: {"queries": len(t.queries), "documents": len(t.corpus)} for t in tasks}
    for t in tasks:
        if t.split_queries is not None:
            sizes[t.name]["queries in the split"] = t.split_queries
        if t.seed is not None:
            sizes[t.name]["seed"] = t.seed
    if encoder is not None:
        for name, counts in truncation_counts(encoder, tasks, max_length or encoder.config.max_length).items():
            sizes[name].update(counts)
    return sizes


def truncation_counts(encoder, tasks: Sequence[RetrievalTask], max_length: int) -> dict[str, dict[str, int]]:
    """{task: {"truncated queries": n, "truncated documents": m}}: texts with more than `max_length` tokens as
    `encoder` reads them in the evaluation (the prompts mteb_code.MTEBEncoder gives the task, and the EOS token
    when the encoder appends one), so cut on the right at `max_length`."""
    from .mteb_code import task_prompts

    limit = max_length - (1 if encoder.config.eos_appended else 0)
    counts = {}
    for task in tasks:
        query, document = task_prompts(encoder.config, task.name, instruction_overrides(encoder.config, [task]))
        texts = {
            "truncated queries": encoder.format_texts(list(task.queries.values()), "query", query),
            "truncated documents": encoder.format_texts([corpus_text(t) for t in task.corpus.values()], "document",
                                                        document),
        }  # fmt: skip
        counts[task.name] = {
            key: sum(len(ids) > limit for ids in encoder.tokenizer(rows, add_special_tokens=False)["input_ids"])
            for key, rows in texts.items()
        }
    return counts


def chunked_topk(queries: np.ndarray, corpus: np.ndarray, k: int, chunk: int = 65_536) -> tuple[np.ndarray, np.ndarray]:
    """(scores, indices), each (Q, k), of the k best corpus rows by dot product, best first.

    The corpus is scored `chunk` rows at a time and merged into a running top-k, so extra memory is
    O(Q * (chunk + k)) whatever the corpus size.
    """
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


def recall_at_k(ranked: Sequence[str], relevant: dict[str, int], k: int = 10) -> float:
    hits = {d for d, rel in relevant.items() if rel > 0}
    return len(hits & set(ranked[:k])) / len(hits) if hits else 0.0


def score_rankings(task: RetrievalTask, rankings: dict[str, list[str]], k: int = 10) -> dict[str, float]:
    ids = list(task.queries)
    return {
        f"ndcg_at_{k}": float(np.mean([ndcg_at_k(rankings[q], task.qrels[q], k) for q in ids])),
        f"recall_at_{k}": float(np.mean([recall_at_k(rankings[q], task.qrels[q], k) for q in ids])),
        "queries": len(ids),
        "documents": len(task.corpus),
    }


def query_ndcg(task: RetrievalTask, rankings: dict[str, list[str]], k: int = 10) -> dict[str, float]:
    """{query id: nDCG@k} of each query's ranking: the per-query values whose mean `score_rankings` reports."""
    return {q: ndcg_at_k(rankings[q], task.qrels[q], k) for q in task.queries}


def embedding_query_scores(task: RetrievalTask, queries: np.ndarray, documents: np.ndarray, k: int = 10):
    """{query id: nDCG@k} from normalised query (Q, d) and document (N, d) embeddings, in task order."""
    doc_ids = list(task.corpus)
    _, top = chunked_topk(queries, documents, k)  # (Q, k)
    return query_ndcg(task, {q: [doc_ids[j] for j in row] for q, row in zip(task.queries, top, strict=True)}, k)


def score_embeddings(task: RetrievalTask, queries: np.ndarray, documents: np.ndarray, k: int = 10) -> dict[str, float]:
    """Scores of a task from its normalised query (Q, d) and document (N, d) embeddings, in task order."""
    doc_ids = list(task.corpus)
    _, top = chunked_topk(queries, documents, k)
    rankings = {q: [doc_ids[j] for j in row] for q, row in zip(task.queries, top, strict=True)}
    return score_rankings(task, rankings, k)


def evaluate_encoder(
    encode: Callable[..., np.ndarray], task: RetrievalTask, k: int = 10, batch_size: int = 16
) -> dict[str, float]:
    """Scores an encoder's `encode` (C2LLMEncoder.encode or alike) on a task by cosine top-k."""
    docs = encode([corpus_text(t) for t in task.corpus.values()], kind="document", batch_size=batch_size)
    queries = encode(list(task.queries.values()), kind="query", instruction=task.instruction, batch_size=batch_size)
    return score_embeddings(task, queries, docs, k)


def task_embeddings(
    encoder, task: RetrievalTask, batch_size: int = 16, max_length: int | None = None, prompt: tuple | None = None
):
    """Unnormalised (queries (Q, d), documents (N, d)) of a task, with the prompts of the encoder's prompt style, or
    `prompt` = (query instruction, document prefix) when given (a validation task's, `validation.py`)."""
    from .mteb_code import task_prompts

    query, document = prompt or task_prompts(encoder.config, task.name, instruction_overrides(encoder.config, [task]))
    kwargs = {"batch_size": batch_size, "max_length": max_length, "normalize": False}
    docs = encoder.encode([corpus_text(t) for t in task.corpus.values()], kind="document", instruction=document,
                          **kwargs)  # fmt: skip
    return encoder.encode(list(task.queries.values()), kind="query", instruction=query, **kwargs), docs


def truncation_scores(
    task: RetrievalTask, queries: np.ndarray, documents: np.ndarray, dims: Sequence[int], k: int = 10
) -> dict[int, float]:
    """{d: nDCG@k} with every embedding cut to its first d coordinates and re-normalised (`truncate`)."""
    width = queries.shape[1]
    bad = [d for d in dims if not 0 < d <= width]
    if bad:
        raise ValueError(f"cannot truncate {width}-dimensional embeddings to {bad}")
    return {d: score_embeddings(task, truncate(queries, d), truncate(documents, d), k)[f"ndcg_at_{k}"] for d in dims}


def truncation_query_scores(
    task: RetrievalTask, queries: np.ndarray, documents: np.ndarray, dims: Sequence[int], k: int = 10
) -> dict[int, dict[str, float]]:
    """{d: {query id: nDCG@k}}: `truncation_scores` query by query (its scores are these values' means)."""
    width = queries.shape[1]
    bad = [d for d in dims if not 0 < d <= width]
    if bad:
        raise ValueError(f"cannot truncate {width}-dimensional embeddings to {bad}")
    return {d: embedding_query_scores(task, truncate(queries, d), truncate(documents, d), k) for d in dims}


def bm25_scores(tasks: Sequence[RetrievalTask]) -> dict[str, float]:
    """{task: nDCG@10} of the BM25 baseline."""
    return {t.name: evaluate_bm25(t)["ndcg_at_10"] for t in tasks}


def bm25_query_scores(tasks: Sequence[RetrievalTask], k: int = 10) -> dict[str, dict[str, float]]:
    """{task: {query id: nDCG@k}} of the BM25 baseline (the values whose means `bm25_scores` gives)."""
    return {t.name: query_ndcg(t, bm25_rankings(t, k), k) for t in tasks}


def bm25_rankings(task: RetrievalTask, k: int = 10) -> dict[str, list[str]]:
    """{query id: the ids of BM25's top k documents, best first}."""
    doc_ids = list(task.corpus)
    top = bm25_scores_topk(list(task.queries.values()), [corpus_text(task.corpus[d]) for d in doc_ids], k)
    return {q: [doc_ids[j] for j in row] for q, row in zip(task.queries, top, strict=True)}


def evaluate_bm25(task: RetrievalTask, k: int = 10) -> dict[str, float]:
    """The BM25 baseline (bm25s, default parameters, no stopwords) on a task."""
    return score_rankings(task, bm25_rankings(task, k), k)


def baseline_encoder(trained, pooling: str):
    """The untrained-pooler baseline of `trained`: its backbone before training (or, for a released checkpoint,
    the release's own backbone) with a baseline pooler (mean or last token), no LoRA."""
    import dataclasses

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
    return C2LLMEncoder.from_config(cfg)


def baselines(trained, poolings: Sequence[str]) -> dict[str, Any]:
    """{label: baseline encoder} for each pooling: "untrained, mean pooling" on the run's base backbone, or
    "released backbone, mean pooling" when `trained` is a released checkpoint. The baselines share one backbone
    and tokenizer object (their poolers have no weights): it is loaded once, and `evaluate_all` runs it once
    per text for all of them (`mteb_code.shared_forward`)."""
    import dataclasses

    kind = "released backbone" if is_released_checkpoint(trained.config.backbone) else "untrained"
    if not poolings:
        return {}
    first = baseline_encoder(trained, poolings[0])
    built = {poolings[0]: first}
    for p in poolings[1:]:
        built[p] = C2LLMEncoder(first.backbone, first.tokenizer, dataclasses.replace(first.config, pooling=p))
        built[p].directory = first.directory  # a release's backbone: keyed by its folder too (mteb_code.fingerprint)
    return {f"{kind}, {p} pooling": built[p] for p in poolings}


def evaluate_all(
    models: dict[str, Any],
    tasks: Sequence[RetrievalTask],
    cache_dir: str | Path,
    bm25: bool = True,
    batch_size: int = 16,
    max_length: int = 2048,
    log=print,
) -> dict[str, dict[str, float]]:
    """{model: {task: nDCG@10}}: each encoder through mteb.evaluate on the tasks (cached under `cache_dir`,
    one folder per model name), and BM25 through our scorer, which prepares documents the same way. A task with a
    query instruction of its own is evaluated with it (`instruction_overrides`).
    The models share an `EncodingCache`: no model encodes a text twice, models on one backbone object (the
    baselines) share its forward pass, and a `Truncated` view reads its encoder's embeddings."""
    from .mteb_code import EncodingCache, offline_task, run_mteb

    scores: dict[str, dict[str, float]] = {}
    if bm25:
        scores["BM25"] = bm25_scores(tasks)
    cache = EncodingCache(list(models.values()))  # every model registered first, so siblings share each pass
    for label, encoder in models.items():
        model = mteb_model(label, encoder, tasks, batch_size, max_length, cache)
        scores[label] = run_mteb(model, [offline_task(t) for t in tasks], cache_dir)
        log(f"evaluated {label}")
    return scores


def mteb_model(label: str, encoder, tasks: Sequence[RetrievalTask], batch_size: int, max_length: int, cache=None):
    """The mteb encoder `evaluate_all` evaluates a model as on `tasks`: named `local/<label as a slug>`, with the
    tasks' own query instructions (`instruction_overrides`), its revision the fingerprint of the encoder and the
    evaluation settings (so the cache key of its results)."""
    from .mteb_code import MTEBEncoder

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
    """{model: {task: {query id: nDCG@10}}} behind `evaluate_all`'s scores, for the paired bootstrap
    (`uncertainty.py`): each encoder's per-query values from the results mteb cached (no encoding; call
    `evaluate_all` with the same arguments first), BM25's from our scorer. Each task's mean equals its score."""
    from .mteb_code import cached_query_scores, offline_task

    out: dict[str, dict[str, dict[str, float]]] = {}
    if bm25:
        out["BM25"] = bm25_query_scores(tasks)
    for label, encoder in models.items():
        model = mteb_model(label, encoder, tasks, batch_size, max_length)
        out[label] = cached_query_scores(model, [offline_task(t) for t in tasks], cache_dir)
    return out


def results_frame(scores: dict[str, dict[str, float]]):
    """Models x tasks, nDCG@10 x 100, with the mean over tasks as the last column."""
    import pandas as pd

    frame = pd.DataFrame({m: {t: 100 * v for t, v in tasks.items()} for m, tasks in scores.items()}).T
    frame["mean"] = frame.mean(axis=1)
    return frame.round(2)


def results_markdown(
    frame, title: str, sizes: dict[str, dict[str, int]] | None = None, max_length: int | None = None
) -> str:
    """The table as markdown; with `sizes` (`task_sizes`), rows saying how many queries and documents each
    task's corpus held (and how many were truncated, when counted), so that no score is read without its corpus
    size: "40 of 213" queries where a limit drew them, with a line naming the seed; with `max_length`, a line
    stating the evaluation length."""
    sizes = sizes or {}
    header = "| model | " + " | ".join(frame.columns) + " |\n|---|" + "---|" * len(frame.columns) + "\n"
    cell = lambda v: "" if v != v else f"{v:.1f}"  # noqa: E731  a blank for NaN: a public mean has no task scores
    rows = "".join(f"| {m} | " + " | ".join(cell(v) for v in frame.loc[m]) + " |\n" for m in frame.index)
    drawn = ("queries in the split", "seed")
    counts = list(dict.fromkeys(key for task in sizes.values() for key in task if key not in drawn))
    for count in counts:
        cells = [_count_cell(sizes.get(c, {}), count) for c in frame.columns]
        label = f"{count} at {max_length} tokens" if count.startswith("truncated") and max_length else count
        rows += f"| *{label} per task* | " + " | ".join(cells) + " |\n"
    stated = ""
    seeds = sorted({task["seed"] for task in sizes.values() if "queries in the split" in task})
    if seeds:
        stated += (f"\nWhere a task holds more queries than the limit (\"40 of 213\"), the evaluated ones are drawn "
                   f"with seed {', '.join(map(str, seeds))} across all of its queries, the same on every run whatever "
                   "the order of its files; every positive of a drawn query is in its corpus.\n")  # fmt: skip
    if max_length:
        stated += (f"\nEvaluated at max length {max_length} tokens (instruction or document prefix included); "
                   "longer texts are cut on the right.\n")  # fmt: skip
    return f"### {title}\n\n{header}{rows}{stated}"


def _count_cell(task: dict[str, int], count: str) -> str:
    """One task's cell of a `results_markdown` count row: "" when not counted, "40 of 213" for drawn queries."""
    if count not in task:
        return ""
    if count == "queries" and "queries in the split" in task:
        return f"{task['queries']} of {task['queries in the split']}"
    return str(task[count])


@dataclass
class ScoredTable:
    """One table of notebook 04 (`scored_table`): {model: {task: nDCG@10}}, each task's size (`task_sizes`), every
    query's nDCG@10 per model, the trained model's differences to the others with their intervals, and the markdown
    of both; all empty where there were no tasks."""

    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    queries: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    differences: dict = field(default_factory=dict)
    markdown: str = ""


def scored_table(
    models: dict[str, Any],
    tasks: Sequence[RetrievalTask],
    cache_dir: str | Path,
    label: str,
    title: str,
    bm25: bool = True,
    batch_size: int = 16,
    max_length: int = 2048,
) -> ScoredTable:
    """`models` (the trained one named `label`, and its baselines) and BM25 scored on `tasks` (`evaluate_all`, then the
    per-query scores from the same cache, `query_scores`), with each task's size at `max_length` and the difference
    of `label` to every other model with its 95 % interval over queries (`uncertainty.differences`); the markdown is
    the table ("### <title>, nDCG@10 x 100", with its counts and length) followed by the differences."""
    if not tasks:
        return ScoredTable()
    options = {"bm25": bm25, "batch_size": batch_size, "max_length": max_length}
    scores = evaluate_all(models, tasks, cache_dir, **options)
    sizes = task_sizes(tasks, models[label], max_length)
    queries = query_scores(models, tasks, cache_dir, **options)
    diffs = differences(queries, [(label, other) for other in scores if other != label])
    markdown = results_markdown(results_frame(scores), f"{title}, nDCG@10 x 100", sizes, max_length=max_length)
    markdown += "\n" + differences_markdown(diffs, f"{label} against each other model, {title}")
    return ScoredTable(scores, sizes, queries, diffs, markdown)
