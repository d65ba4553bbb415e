"""Statistics of a prepared mix for notebook 01 (rows per group, text lengths), as DataFrames and Figures."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd


def _columns(rows: Any, names: list[str]) -> pd.DataFrame:
    if hasattr(rows, "select_columns"):  # a datasets.Dataset: read only the columns needed
        return rows.select_columns(names).to_pandas()
    return pd.DataFrame([{n: r[n] for n in names} for r in rows], columns=names)


def row_counts(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows per dataset and language, largest first, with each group's share of the mix."""
    frame = _columns(rows, ["dataset", "language"])
    counts = frame.groupby(["dataset", "language"]).size().rename("rows").reset_index()
    counts["share"] = counts["rows"] / max(1, counts["rows"].sum())
    return counts.sort_values("rows", ascending=False, ignore_index=True)


def length_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (record, field) with the text's length in characters."""
    frame = _columns(rows, ["dataset", "query", "positive"])
    long = frame.melt(id_vars="dataset", value_vars=["query", "positive"], var_name="field", value_name="text")
    long["chars"] = long["text"].str.len()
    return long.drop(columns="text")


def length_histograms(rows: Iterable[Mapping[str, Any]]):
    """A Figure: character-length histograms of queries and positives per dataset (log scale)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    frame = length_frame(rows)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    for ax, field in zip(axes, ["query", "positive"], strict=True):
        sns.histplot(
            frame[frame["field"] == field],
            x="chars",
            hue="dataset",
            log_scale=True,
            element="step",
            stat="count",
            common_norm=False,
            ax=ax,
        )
        ax.set_title(f"{field} length (characters)")
    fig.tight_layout()
    plt.close(fig)  # released from pyplot: shown once, where the notebook displays it
    return fig
