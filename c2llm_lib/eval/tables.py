"""Notebook 04's tables (paper section 4.2, table 2's layout): models x tasks of nDCG@10 x 100 with each task's size,
and `evaluate_set`: one call per task set for scores, per-query scores, differences and markdown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..retrieval import RetrievalTask
from .intervals import differences, differences_markdown, differences_record
from .tasks import task_sizes


def results_frame(scores: dict[str, dict[str, float]]):
    """Models x tasks, nDCG@10 x 100, with the mean over tasks as the last column."""
    import pandas as pd

    frame = pd.DataFrame({m: {t: 100 * v for t, v in tasks.items()} for m, tasks in scores.items()}).T
    frame["mean"] = frame.mean(axis=1)
    return frame.round(2)


def results_markdown(
    frame, title: str, sizes: dict[str, dict[str, int]] | None = None, max_length: int | None = None
) -> str:
    """The table as markdown; with `sizes` (`task_sizes`), a row per count ("40 of 213" for drawn queries, with the seed
    stated), and with `max_length` a line stating the evaluation length."""
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
class SetEvaluation:
    """One task set scored (`evaluate_set`): table, scores, sizes, per-query scores, differences, markdown."""

    table: Any = None
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    per_query: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    differences: dict = field(default_factory=dict)
    markdown: str = ""

    @property
    def intervals(self) -> list[dict]:
        return differences_record(self.differences)


def evaluate_set(
    models: dict[str, Any],
    tasks: Sequence[RetrievalTask],
    cache_dir: str | Path,
    label: str,
    title: str,
    name: str = "",
    bm25: bool = True,
    batch_size: int = 16,
    max_length: int = 2048,
    untrained: bool = True,
) -> SetEvaluation:
    """`models` (the trained one is `label`; without `untrained`, it alone) and BM25 scored on `tasks` through mteb,
    with each task's size and `label`'s difference to every other model with its 95 % interval; no tasks: an empty
    result."""
    from .mteb import evaluate_all, query_scores

    if not tasks:
        return SetEvaluation()
    unscored = [] if untrained else [m for m in models if m != label]
    models = {m: model for m, model in models.items() if m not in unscored}
    options = {"bm25": bm25, "batch_size": batch_size, "max_length": max_length}
    scores = evaluate_all(models, tasks, cache_dir, **options)
    sizes = task_sizes(tasks, models[label], max_length)
    per_query = query_scores(models, tasks, cache_dir, **options)
    diffs = differences(per_query, [(label, other) for other in scores if other != label])
    table = results_frame(scores)
    markdown = results_markdown(table, title, sizes, max_length=max_length) + "\n"
    if unscored:
        markdown += f"Not scored on these tasks (`untrained_sets`): {', '.join(unscored)}.\n\n"
    markdown += differences_markdown(diffs, f"{label} against each other model" + (f", {name}" if name else ""))
    return SetEvaluation(table, scores, sizes, per_query, diffs, markdown)
