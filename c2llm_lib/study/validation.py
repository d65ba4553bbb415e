"""A validation split carved from a run's training rows, on which notebook 06 chooses rates so the test tasks choose
nothing: by file on the offline snapshot, else by normalised query, rows sharing a text with it dropped
(docs/studies.md#rates-chosen-on-a-validation-split)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from ..data.offline import CODE_TO_CODE, TEXT_TO_CODE, load_snapshot
from ..data.records import text_key
from ..eval.tasks import task_from_rows
from ..prompts import prompts
from ..retrieval import RetrievalTask

SALT = "validation:"
SHORT = {TEXT_TO_CODE: "text2code", CODE_TO_CODE: "code2code"}


def in_validation(unit: str, percent: int) -> bool:
    """Whether a file path (or normalised query key) falls in the validation share of `percent` %."""
    return int(hashlib.sha256((SALT + unit).encode()).hexdigest(), 16) % 100 < percent


@dataclass
class ValidationSplit:
    """The training rows that remain, the validation tasks, and how they were split (for the records)."""

    rows: Any  # datasets.Dataset: the training rows without the validation share
    tasks: list[RetrievalTask]
    rule: str  # "file" (offline snapshot) or "query"
    percent: int
    units: int  # validation files, or validation queries
    dropped: dict[str, int] = field(default_factory=dict)  # training rows dropped, by reason
    datasets: dict[str, str] = field(default_factory=dict)  # task name -> the training dataset its rows come from

    def prompts(self, config, task: RetrievalTask) -> tuple[str, str]:
        """(query instruction, document prefix) of a validation task for a ModelConfig, as training prompts its rows."""
        if config.prompt_style == "c2llm":
            return task.instruction, config.document_prefix
        return prompts(config.prompt_style, self.datasets[task.name], config.document_prefix)

    def summary(self) -> dict[str, Any]:
        sizes = {t.name: {"queries": len(t.queries), "documents": len(t.corpus)} for t in self.tasks}
        return {"rule": self.rule, "percent": self.percent, "validation units": self.units, "tasks": sizes,
                "training rows kept": len(self.rows), "training rows dropped": dict(self.dropped)}  # fmt: skip


def snapshot_files() -> dict[tuple[str, str, str], str]:
    """{(dataset, query key, positive key): file} of the snapshot's train rows."""
    return {(r["dataset"], text_key(r["query"]), text_key(r["positive"])): r["file"]
            for r in load_snapshot() if r["split"] == "train"}  # fmt: skip


def validation_split(
    rows, percent: int, limit: int | None = None, max_documents: int | None = None, seed: int = 0
) -> ValidationSplit:
    """Training rows and validation tasks; an empty side is an error naming `validation_percent`."""
    if not 1 <= percent <= 50:
        raise ValueError(f"validation_percent must be from 1 to 50, got {percent}")
    if len(rows) == 0:
        raise ValueError("validation_percent: no training rows to split")
    files = snapshot_files()
    columns = (rows["dataset"], rows["query"], rows["positive"])
    keys = [(d, text_key(q), text_key(p)) for d, q, p in zip(*columns, strict=True)]
    if all(k in files for k in keys):
        rule, units = "file", [files[k] for k in keys]
        chosen = {f for f in set(files.values()) if in_validation(f, percent)}
        pool = [dict(r) for r in load_snapshot() if r["split"] == "train" and r["file"] in chosen]
    else:
        rule, units = "query", [k[1] for k in keys]
        chosen = {u for u in set(units) if in_validation(u, percent)}
        pool = [dict(rows[i]) for i, u in enumerate(units) if u in chosen]
    if not pool:
        kind = {"file": "files", "query": "distinct queries"}[rule]
        raise ValueError(f"validation_percent {percent}: none of the {len(set(units))} training {kind} falls in the "
                         "validation share; raise validation_percent")  # fmt: skip
    held = {text_key(r[c]) for r in pool for c in ("query", "positive")}
    in_share = [u in chosen for u in units]
    shares_text = [not s and (k[1] in held or k[2] in held) for s, k in zip(in_share, keys, strict=True)]
    kept = [i for i in range(len(rows)) if not in_share[i] and not shares_text[i]]
    if not kept:
        raise ValueError(f"validation_percent {percent}: every training row is a validation {rule} or shares its "
                         "text; lower validation_percent")  # fmt: skip
    dropped = {f"validation {rule}s": sum(in_share), "text shared with validation": sum(shares_text)}
    tasks, datasets = validation_tasks(pool, limit, max_documents, seed)
    return ValidationSplit(rows.select(kept), tasks, rule, percent, len(chosen), dropped, datasets)


def validation_tasks(
    pool: list[dict[str, Any]], limit: int | None, max_documents: int | None, seed: int
) -> tuple[list[RetrievalTask], dict[str, str]]:
    """One task per (dataset, language) of the validation rows (`task_from_rows`), and {task: dataset}."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in pool:
        groups.setdefault((row["dataset"], row["language"]), []).append(row)
    tasks, datasets = [], {}
    for (dataset, language), group in sorted(groups.items()):
        name = f"validation-{SHORT.get(dataset, dataset)}-{language}"
        tasks.append(task_from_rows(name, group, group[0]["instruction"], limit, max_documents, seed))
        datasets[name] = dataset
    return tasks, datasets
