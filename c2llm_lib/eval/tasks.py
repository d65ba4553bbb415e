"""The retrieval tasks notebook 04 scores (paper section 4.2): the offline held-out tasks and HumanEval, a run's own
held-out split, the unseen libraries, a limit drawn with a seed, the sizes and truncation counts shown beside every
score, the query instructions and prompts a task gets, and the note on sets the training was not checked against.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..data.beir import read_beir_sets
from ..data.offline import TEXT_TO_CODE, humaneval_records, load_snapshot
from ..data.records import DataError
from ..data.sources import TABLE_1
from ..data.unseen import mine_packages, package_pins
from ..prompts import HELDOUT_RECIPES, prompts, recipe_task
from ..retrieval import RetrievalTask, corpus_text, file_safe


def limit_task(
    task: RetrievalTask, limit: int | None = None, max_documents: int | None = None, seed: int = 0
) -> RetrievalTask:
    """`task` with `limit` of its queries drawn with `seed` (`drawn_queries`; all when None), in task order, recording
    how many it held (`split_queries`) and the seed; a limit never shortens the corpus. With `max_documents`, the
    corpus keeps every document judged for an evaluated query and a sample of the others (seeded by `seed` and the
    task name) up to `max_documents`, with their ids and order."""
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
    """Held-out offline tasks, one per (recipe, language), plus HumanEval; `limit` and `max_documents` as in
    `limit_task` (every task's corpus holds all of its held-out documents unless `max_documents` caps it)."""
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


@dataclass
class TaskSets:
    """The task sets notebook 04 scores, each in a table of its own: the held-out tasks (`evaluation_tasks`), the local
    BEIR sets (`data.beir`) and the unseen libraries (`unseen_tasks`), all limited alike (`limit_task`)."""

    heldout: list[RetrievalTask]
    beir: list[RetrievalTask]
    unseen: list[RetrievalTask]
    evaluated_on: str  # where the held-out tasks come from, in words
    unseen_pins: dict[str, str]  # {unseen task: its package's pin} (`unseen_task_names`), for `contamination_note`

    @property
    def names(self) -> list[str]:
        return [t.name for t in (*self.heldout, *self.beir, *self.unseen)]


def task_sets(evaluation, heldout=None) -> TaskSets:
    """The task sets of notebook 04's `evaluation` (its EvalStage) with `eval_limit` and `eval_max_documents`, the
    held-out tasks from `heldout` (the run's own split) or the offline ones. A bad BEIR set fails here, naming its
    file, line and column; an unseen library's wheel is fetched once into the cache, refused when its hash differs."""
    limits = (evaluation.eval_limit, evaluation.eval_max_documents)
    beir = [limit_task(t, *limits) for t in read_beir_sets(evaluation.beir_sets, evaluation.beir_instruction)]
    unseen = unseen_tasks(evaluation.unseen_packages, *limits)
    where = "the run's own held-out split" if heldout is not None else "the offline held-out split and HumanEval"
    return TaskSets(
        evaluation_tasks(heldout, *limits), beir, unseen, where, unseen_task_names(evaluation.unseen_packages)
    )


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
    """A paragraph naming the evaluated sets (task names, in order) that `model`'s training rows were not checked
    against, "" when there is none. `data_record` is the run's `metrics/data.json` (None for a release: every set is
    named): notebook 01 checks the held-out tasks always, the unseen libraries whose pins it records (`unseen`: each
    unseen task's pin), the MTEB tasks it records (`CHECKED_KEY`), never a BEIR set or another benchmark."""
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
    `encoder` reads them in the evaluation (the prompts eval.mteb.MTEBEncoder gives the task, and the EOS token
    when the encoder appends one), so cut on the right at `max_length`."""
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
