"""The retrieval tasks notebook 04 scores (paper section 4.2): offline held-out tasks and HumanEval, a run's own
held-out split, the unseen libraries, seeded limits, sizes and truncation counts, query instructions, and the note on
sets the training was not checked against."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..data.beir import read_beir_sets
from ..data.offline import TEXT_TO_CODE, humaneval_records, load_snapshot
from ..data.records import DataError
from ..data.sources import TABLE_1
from ..data.unseen import mine_packages, package_pins
from ..prompts import HELDOUT_RECIPES, prompts, recipe_task
from ..retrieval import RetrievalTask, corpus_text, file_safe

RECIPE_NAMES = {recipe: short for short, recipe in HELDOUT_RECIPES.items()}  # CodeSearchNetRetrieval -> text2code


def limit_task(
    task: RetrievalTask, limit: int | None = None, max_documents: int | None = None, seed: int = 0
) -> RetrievalTask:
    """`task` with `limit` of its queries drawn with `seed` (`drawn_queries`; all when None), recording the split's
    count and the seed; with `max_documents`, the corpus keeps every judged document plus a seeded sample."""
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
    """The ids of `limit` queries of `task`, in task order, with the smallest seeded hash of their text and answers: the
    same draw on every run whatever the order of the rows."""

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
    """A task of the rows' queries (`limit` drawn as in `limit_task`) whose corpus holds every positive and every text
    of `documents`; identical documents share an id. `distinct_queries` merges rows sharing a query text."""
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
    """Held-out offline tasks per (recipe, language) plus HumanEval; limits as in `limit_task`."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in load_snapshot():
        if row["split"] == "test":
            groups.setdefault((row["dataset"], row["language"]), []).append(row)
    tasks = []
    for (dataset, language), rows in sorted(groups.items()):
        name = f"offline-{RECIPE_NAMES[dataset]}-{language}"
        tasks.append(task_from_rows(name, rows, TABLE_1[dataset], limit, max_documents, seed))
    if include_humaneval:
        tasks.append(
            task_from_rows("HumanEval", humaneval_records(), TABLE_1[TEXT_TO_CODE], limit, max_documents, seed)
        )
    return tasks


HELDOUT_COLUMNS = ("dataset", "language", "query", "positive", "instruction")


def heldout_task_names(groups: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """{(dataset, language): task name}: `heldout-text2code-<language>`, `heldout-code2code-<language>`, or
    `heldout-<group>-<language>` for a user's group (file-safe, unique, never read as a code recipe's)."""
    names: dict[tuple[str, str], str] = {}
    for dataset, language in sorted(set(groups)):
        if dataset in RECIPE_NAMES:
            name = f"heldout-{RECIPE_NAMES[dataset]}-{language}"
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
    """Tasks of a run's held-out split, one per (dataset, language); an empty split is refused."""
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
    """The run's own held-out tasks when it has a split, else the offline held-out tasks and HumanEval."""
    if heldout is not None:
        return heldout_tasks(heldout, limit, max_documents, seed)
    return offline_tasks(limit, max_documents=max_documents, seed=seed)


def unseen_task_names(entries: Sequence[str]) -> dict[str, str]:
    """{task name: its package's pin} of the tasks `unseen_tasks` would make (no fetching)."""
    return {f"unseen-{short}-{file_safe(pin.name)}": str(pin) for pin in package_pins(entries)
            for short in HELDOUT_RECIPES}  # fmt: skip


def unseen_tasks(
    entries: Sequence[str],
    limit: int | None = None,
    max_documents: int | None = None,
    seed: int = 0,
) -> list[RetrievalTask]:
    """`unseen-text2code-<package>` and `unseen-code2code-<package>` per pinned, hash-checked library
    (`data.unseen.mine_packages`), against its whole corpus; `limit` and `max_documents` as in `limit_task`."""
    tasks = []
    for mined in mine_packages(entries) if entries else []:
        for short, recipe in HELDOUT_RECIPES.items():
            tasks.append(task_from_rows(f"unseen-{short}-{file_safe(mined.pin.name)}", mined.rows[recipe],
                                        TABLE_1[recipe], limit, max_documents, seed, distinct_queries=True,
                                        documents=mined.corpus[recipe]))  # fmt: skip
    return tasks


@dataclass
class TaskSets:
    """Notebook 04's task sets, a table each: held-out, local BEIR and unseen libraries, limited alike."""

    heldout: list[RetrievalTask]
    beir: list[RetrievalTask]
    unseen: list[RetrievalTask]
    evaluated_on: str  # where the held-out tasks come from, in words
    unseen_pins: dict[str, str]  # {unseen task: its package's pin} (`unseen_task_names`), for `contamination_note`

    @property
    def names(self) -> list[str]:
        return [t.name for t in (*self.heldout, *self.beir, *self.unseen)]


def task_sets(evaluation, heldout=None) -> TaskSets:
    """Notebook 04's task sets for `evaluation`; a bad BEIR set fails naming its file, line and column."""
    limits = (evaluation.eval_limit, evaluation.eval_max_documents)
    beir = [limit_task(t, *limits) for t in read_beir_sets(evaluation.beir_sets, evaluation.beir_instruction)]
    unseen = unseen_tasks(evaluation.unseen_packages, *limits)
    where = "the run's own held-out split" if heldout is not None else "the offline held-out split and HumanEval"
    return TaskSets(
        evaluation_tasks(heldout, *limits), beir, unseen, where, unseen_task_names(evaluation.unseen_packages)
    )


def instruction_overrides(config, tasks: Sequence[RetrievalTask]) -> dict[str, str]:
    """{task: its own query instruction} for the tasks the c2llm prompt set has none for (a files group, a BEIR set);
    empty for the peer prompt styles, which evaluate with their own prompts."""
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


CHECKED_KEY = "decontaminated_mteb_tasks"  # notebook 01's record in metrics/data.json (data/build.py)


def contamination_note(
    evaluated: Sequence[str], data_record: dict | None, model: str, unseen: dict[str, str] | None = None
) -> str:
    """A paragraph naming the evaluated sets the training rows were not checked against, or ""."""
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
    """A task notebook 01 always decontaminates against: offline held-out, HumanEval, a run's own held-out."""
    return task == "HumanEval" or task.startswith(("offline-", "heldout-"))


def task_sizes(
    tasks: Sequence[RetrievalTask], encoder=None, max_length: int | None = None
) -> dict[str, dict[str, int]]:
    """{task: {"queries", "documents"}}, plus "queries in the split" and "seed" where a limit drew the queries, and with
    an `encoder` the truncation counts at `max_length`."""
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
    """{task: {"truncated queries", "truncated documents"}} at `max_length`, as evaluated."""
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
