"""The recipe comparison (C2LLM section 3's takeaway against jina-code-embeddings and CodeXEmbed): one row per model and
width, quality-vs-dimension curves, differences with 95 % intervals, and `metrics/comparison.{json,md}`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..eval.intervals import difference_sentences, differences, differences_markdown, differences_record, task_means
from ..figures import TRAINING_COLUMNS, recipe_comparison
from .plan import Entry
from .sweep import markdown_table
from .trainings import query_rows


def training_peak(training: dict[str, Any]) -> float | None:
    """Memory a training needed beyond loading: CUDA's peak, else its window's resident peak, else the process's."""
    return training.get("peak_cuda_gb", training.get("train_peak_rss_gb", training.get("peak_rss_gb")))


def comparison_frame(results: dict[str, dict[str, Any]], bm25: dict[str, float] | None = None):
    """One row per (model, width): curve, per-task nDCG@10 x 100, mean, and training figures."""
    import pandas as pd

    rows = []
    for label, result in results.items():
        truncation = f"{result['recipe']}: {'MRL truncation' if result['mrl'] else 'truncation'}"
        for d, per_task in result["scores"].items():
            trained = int(d) == result["width"]
            curve = f"{result['recipe']}: PMA projection" if result["projected"] else truncation
            training = result["training"] if trained else {}
            rows.append({"model": label if trained else f"{label}, truncated to {d}", "recipe": result["recipe"],
                         "dim": int(d), "curve": curve, **{t: 100 * v for t, v in per_task.items()},
                         "tokens/s": training.get("tokens_per_second"),
                         "peak memory GB": training_peak(training),
                         "train s": training.get("seconds"), "loss_first": training.get("loss_first"),
                         "loss_last": training.get("loss_last")})  # fmt: skip
    if bm25:
        rows.append({"model": "BM25", "recipe": "BM25", "dim": 0, "curve": "BM25",
                     **{t: 100 * v for t, v in bm25.items()}})  # fmt: skip
    frame = pd.DataFrame(rows).set_index("model")
    tasks = [c for c in frame.columns if c not in ("recipe", "dim", "curve", *TRAINING_COLUMNS)]
    frame.insert(3, "mean", frame[tasks].mean(axis=1))
    return frame.round(2)


def dimension_table(frame):
    """Mean nDCG@10 per curve (rows) and width (columns, widest first)."""
    models = frame[frame["curve"] != "BM25"]
    table = models.pivot_table(index="curve", columns="dim", values="mean", aggfunc="first")
    for curve in table.index:
        if curve.endswith(": PMA projection"):
            recipe = curve.removesuffix(": PMA projection")
            full = models[(models["recipe"] == recipe) & ~models["curve"].str.endswith("PMA projection")]
            widest = full[full["dim"] == full["dim"].max()]
            if len(widest):
                table.loc[curve, int(widest["dim"].iloc[0])] = widest["mean"].iloc[0]
    return table[sorted(table.columns, reverse=True)]


def recipe_pairs(entries: Sequence[Entry], bm25: bool = True) -> list[tuple[str, str]]:
    """The first recipe against each other (and BM25); each PMA projection against its truncation."""
    recipes = [e.label for e in entries if e.study == "recipes" and not e.projected]
    if not recipes:
        return []
    pairs = [(recipes[0], other) for other in recipes[1:]] + [(recipes[0], "BM25")] * bm25
    return pairs + [(e.label, f"{e.parent}, truncated to {e.model.embedding_dim}")
                    for e in entries if e.study == "recipes" and e.projected]  # fmt: skip


def verdict(frame, dims_table, notes: Sequence[str] = (), diffs=None) -> str:
    """The outcome in sentences from `comparison_frame`'s numbers and, when given, the differences' intervals."""
    trained = frame.dropna(subset=["tokens/s"])
    full = trained[~trained["curve"].str.endswith("PMA projection")].sort_values("mean", ascending=False)
    lines = ["At full width, mean nDCG@10 ranks " + ", then ".join(
        f"{m} ({r['mean']:.1f}, d={int(r['dim'])})" for m, r in full.iterrows()) + "."]  # fmt: skip
    if "BM25" in frame.index:
        bm25 = frame.loc["BM25", "mean"]
        beaten = [m for m, r in full.iterrows() if r["mean"] > bm25]
        outcome = f"{', '.join(beaten)} beat it." if beaten else "no recipe beats it."
        lines.append(f"BM25 scores {bm25:.1f}; {outcome}")
    if len(dims_table.columns) > 1:
        smallest = min(dims_table.columns)
        at = dims_table[smallest].dropna().sort_values(ascending=False)
        lines.append(f"At d={smallest}: " + ", ".join(f"{c} {v:.1f}" for c, v in at.items()) + ".")
        for curve, row in dims_table.iterrows():
            row = row.dropna()
            if len(row) > 1:
                top, low = row[max(row.index)], row[min(row.index)]
                lines.append(f"{curve}: {top:.1f} at d={max(row.index)}, {low:.1f} at d={min(row.index)} "
                             f"({low - top:+.1f}).")  # fmt: skip
    speed = trained.sort_values("tokens/s", ascending=False)
    lines.append("Training throughput (real tokens/s): " + ", ".join(
        f"{m} {r['tokens/s']:.0f}" for m, r in speed.iterrows()) + "; peak memory (GB): " + ", ".join(
        f"{m} {r['peak memory GB']:.2f}" for m, r in speed.iterrows()) + ".")  # fmt: skip
    if trained["loss_first"].notna().all():
        lines.append("Training loss, mean of the first and the last 5 steps: " + ", ".join(
            f"{m} {r['loss_first']:.2f} to {r['loss_last']:.2f} ({100 * (r['loss_last'] / r['loss_first'] - 1):+.0f} %)"
            for m, r in trained.iterrows()) + ".")  # fmt: skip
    lines += difference_sentences(diffs or {})
    lines += [f"Setting: {note}." for note in notes]
    return "\n".join(f"- {line}" for line in lines)


def comparison_markdown(frame, title: str) -> str:
    """The comparison table as markdown, blanks where a column does not apply."""
    columns = [c for c in frame.columns if c not in ("recipe", "curve")]
    digits = {"dim": 0, "tokens/s": 0, "peak memory GB": 2, "train s": 1, "loss_first": 2, "loss_last": 2}

    def cell(column: str, value) -> str:
        if value is None or value != value or (column == "dim" and value == 0):  # NaN != NaN
            return ""
        return f"{value:.{digits.get(column, 1)}f}"

    return f"### {title}\n\nnDCG@10 x 100 on the offline held-out tasks.\n\n" + markdown_table(frame[columns], cell)


def record(
    frame, dims_table, trainings: dict[str, Any], notes: Sequence[str], compute_from: str, diffs=None
) -> dict[str, Any]:
    """What `metrics/comparison.json` holds: table, curves, trainings, notes, compute source and differences."""
    curves = {c: {int(d): float(v) for d, v in dims_table.loc[c].dropna().items()} for c in dims_table.index}
    return {"table": json.loads(frame.reset_index().to_json(orient="records")), "dimensions": curves,
            "trainings": trainings, "notes": list(notes), "compute_from": compute_from,
            "differences": differences_record(diffs or {})}  # fmt: skip


@dataclass
class RecipeStudy:
    """The recipe comparison of one run: tables, differences, sentences, record, markdown and figure."""

    table: Any
    dimensions: Any
    differences: dict
    outcome: str
    record: dict[str, Any]
    markdown: str
    figure: Any

    @property
    def differences_markdown(self) -> str:
        return differences_markdown(self.differences, "Differences")


def compare_recipes(
    entries: Sequence[Entry], results: dict[str, dict[str, Any]], per_seed: dict[str, dict[int, dict[str, Any]]],
    bm25: dict[str, dict[str, float]], notes: Sequence[str], compute_from: str, run: str,
) -> RecipeStudy | None:  # fmt: skip
    """The recipe comparison of the "recipes" entries, or None when no recipe was compared."""
    recipes = {e.label: results[e.label] for e in entries if e.study == "recipes"}
    if not recipes:
        return None
    table = comparison_frame(recipes, task_means(bm25))
    dims = dimension_table(table)
    diffs = differences(query_rows(recipes, bm25), recipe_pairs(entries))
    outcome = verdict(table, dims, notes, diffs)
    trainings = {label: {seed: found["training"] for seed, found in per_seed[label].items()} for label in recipes}
    markdown = (comparison_markdown(table, f"Recipes on equal terms, run {run}") + "\n"
                + differences_markdown(diffs, "Differences with 95 % intervals") + "\n" + outcome + "\n")  # fmt: skip
    return RecipeStudy(table, dims, diffs, outcome, record(table, dims, trainings, notes, compute_from, diffs),
                       markdown, recipe_comparison(table, dims))  # fmt: skip
