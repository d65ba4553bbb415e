"""Figures for the notebooks, each returned, never shown or saved: training curves (section 4.1), per-task scores (4.2),
the recipe and pooling studies, and PMA attention as heatmaps and shaded HTML coloured relative to uniform (section 3).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

from .attention import TokenAttention
from .config import TrainConfig, from_dict


def detached(fig):
    """`fig`, no longer tracked by pyplot (it still draws, saves and displays)."""
    import matplotlib.pyplot as plt

    plt.close(fig)
    return fig


UNIFORM_RANGE = 8.0  # the heatmaps' colour scale runs from 1/8 to 8 times uniform attention


def relative_to_uniform(weights: np.ndarray) -> np.ndarray:
    """Attention weights (..., T) times T: 1 is uniform attention over the T tokens, 2 twice uniform."""
    return weights * weights.shape[-1]


def attention_heatmap(item: TokenAttention, title: str = ""):
    """Two panels, mean over heads and heads x tokens, prefix and specials marked; colour is weight x T on one log scale
    (docs/evaluation.md#attention-notebook-05)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import FixedLocator, FuncFormatter

    H, T = item.weights.shape
    norm = LogNorm(vmin=1 / UNIFORM_RANGE, vmax=UNIFORM_RANGE)  # 1 (uniform) in the middle
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 0.22 * T) + 1.2, 2.4 + 0.12 * H), sharex=True,
                                      layout="constrained",
                                      gridspec_kw={"height_ratios": [1, max(2, H // 4)]})  # fmt: skip
    floor = 1e-6  # a weight that underflowed to 0 is drawn as the lowest colour, not as missing
    mean = np.maximum(relative_to_uniform(item.weights.mean(0, keepdims=True)), floor)  # (1, T)
    heads = np.maximum(relative_to_uniform(item.weights), floor)  # (H, T)
    image = top.imshow(mean, aspect="auto", cmap="RdBu_r", norm=norm, interpolation="nearest")
    bottom.imshow(heads, aspect="auto", cmap="RdBu_r", norm=norm, interpolation="nearest")
    top.set_yticks([0], ["mean"])
    bottom.set_yticks(np.arange(0, H, max(1, H // 8)))
    bottom.set_ylabel("head")
    bottom.set_xticks(np.arange(T), item.tokens, rotation=90, fontsize=7, family="monospace")
    for i, label in enumerate(bottom.get_xticklabels()):
        if item.special[i]:
            label.set_color("crimson")
        elif i < item.prefix_tokens:
            label.set_color("gray")
    ticks = [UNIFORM_RANGE**e for e in np.arange(-1, 1.01, 1 / 3)]
    bar = fig.colorbar(image, ax=[top, bottom], extend="both", pad=0.01)
    bar.ax.yaxis.set_major_locator(FixedLocator(ticks))
    bar.ax.yaxis.set_minor_locator(FixedLocator([]))
    bar.ax.yaxis.set_major_formatter(FuncFormatter(
        lambda v, _: "1 = uniform" if abs(v - 1) < 1e-9 else f"{v:g}" if v > 1 else f"1/{1 / v:g}"))  # fmt: skip
    bar.set_label(f"attention x T (T = {T} tokens)")
    cut = f" [truncated: first {T} of {item.full_tokens} tokens]" if item.truncated else ""
    top.set_title((title or "PMA attention relative to uniform (gray: instruction or prefix, red: special)") + cut)
    return detached(fig)


def loss_description(train, negatives_used: int | None = None, short_rows: int = 0) -> str:
    """The loss a recipe optimises, in words, with the K used and the rows with fewer negatives."""
    if isinstance(train, dict):
        train = from_dict(TrainConfig, train, "loss_curves(train=...)")
    if not isinstance(train, TrainConfig):
        raise TypeError(f"loss_curves: train must be a TrainConfig or its dict, got {type(train).__name__}")
    K, B, tau = train.num_negatives if negatives_used is None else negatives_used, train.global_batch_size, train.tau
    if K == 0:
        loss = f"InfoNCE, in-batch negatives only (K = 0) over the global batch of {B}, tau = {tau:g}"
    elif train.joint_softmax:
        loss = f"InfoNCE, one joint softmax over the global batch of {B} and K = {K} hard negatives, tau = {tau:g}"
    else:
        loss = f"InfoNCE, in-batch negatives over the global batch of {B} + K = {K} hard negatives, tau = {tau:g}"
    if K != train.num_negatives:
        loss += f" (the recipe asks K = {train.num_negatives}; no row holds more than {K})"
    if K and short_rows:
        loss += f"; {short_rows} row(s) of the run's batches had fewer than K negatives"
    if not train.gather_with_grad:
        loss += " (positives gathered without gradient)"
    if train.mrl_dims:
        weights = f", weights [1, {', '.join(f'{w:g}' for w in train.mrl_weights)}]" if train.mrl_weights else ""
        loss = f"Matryoshka loss over widths [full, {', '.join(map(str, train.mrl_dims))}]{weights} of: {loss}"
    return loss


def loss_curves(metrics: Sequence[dict], train=None, negatives_used: int | None = None):
    """Training loss per step by dataset with the learning rate; Matryoshka losses in a second panel."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    short = sum(m.get("short_of_k", 0) for m in metrics)
    title = loss_description(train, negatives_used, short) if train is not None else "training loss (recipe not given)"
    frame = pd.DataFrame(list(metrics))
    widths = sorted((c for c in frame.columns if c.startswith("loss@")), key=lambda c: -int(c[len("loss@") :]))
    fig, axes = plt.subplots(1, 2 if widths else 1, figsize=(13 if widths else 8, 3.8), squeeze=False,
                             layout="constrained")  # fmt: skip
    ax = axes[0, 0]
    sns.scatterplot(frame, x="step", y="loss", hue="dataset", ax=ax, s=18)
    ax.plot(frame["step"], frame["loss"].rolling(5, min_periods=1).mean(), color="black", lw=1, label="mean of 5")
    ax.legend(fontsize=7)
    ax.set_ylabel("loss (weighted sum over widths)" if widths else "loss")
    lr = ax.twinx()
    lr.plot(frame["step"], frame["lr"], color="gray", ls="--", lw=1)
    lr.set_ylabel("learning rate", color="gray")
    if widths:
        for column in widths:
            axes[0, 1].plot(frame["step"], frame[column].rolling(5, min_periods=1).mean(), label=column)
        axes[0, 1].set(xlabel="step", ylabel="loss at width d (mean of 5)", title="per-width loss")
        axes[0, 1].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return detached(fig)


def score_bars(frame):
    """Per-task nDCG@10 bars for each model, from a models x tasks frame (as `eval.tables.results_frame`)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    long = frame.reset_index(names="model").melt(id_vars="model", var_name="task", value_name="nDCG@10")
    fig, ax = plt.subplots(figsize=(max(7, 1.4 * frame.shape[1]), 3.8))
    sns.barplot(long, x="task", y="nDCG@10", hue="model", ax=ax)
    ax.tick_params(axis="x", rotation=30)
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return detached(fig)


def attention_html(item: TokenAttention, title: str = "") -> str:
    """A page of the text with each token shaded by its mean attention relative to uniform (`attention_spans`)."""
    T = len(item.tokens)
    cut = f" Truncated: only the first {T} of {item.full_tokens} tokens were used." if item.truncated else ""
    legend = (f"Shade: attention relative to uniform (1/{T} per token): none = uniform, red = more, blue = less, "
              f"full colour at {UNIFORM_RANGE:g}x more or less. Hover a token for its weight.{cut}")  # fmt: skip
    return (f"<html><body><h3>{html.escape(title)}</h3><p>{html.escape(legend)}</p>"
            + attention_spans(item) + "</body></html>")  # fmt: skip


def attention_spans(item: TokenAttention, style: str = "font-size:13px;line-height:1.6") -> str:
    """A `<pre>` of tokens shaded by attention relative to uniform, weights in titles, specials boxed."""
    weights = item.weights.mean(0)  # (T,)
    relative = relative_to_uniform(weights)  # (T,)
    strength = np.clip(np.log(np.maximum(relative, 1e-12)) / np.log(UNIFORM_RANGE), -1.0, 1.0)  # (T,) in [-1, 1]
    spans = []
    for tok, w, r, a, special in zip(item.tokens, weights, relative, strength, item.special, strict=True):
        text = html.escape(tok.replace("\u00b7", " ").replace("\u21b5", "\u21b5\n"))
        border = "border:1px solid crimson;" if special else ""
        colour = f"rgba(178,24,43,{a:.2f})" if a >= 0 else f"rgba(33,102,172,{-a:.2f})"
        spans.append(f'<span title="{w:.4f} = {r:.2f} x uniform" style="background:{colour};{border}">{text}</span>')
    return f"<pre style='{style}'>" + "".join(spans) + "</pre>"


# the training's columns of `study.recipes.comparison_frame` (the others: the recipe, its curve, nDCG@10 per task)
TRAINING_COLUMNS = ("tokens/s", "peak memory GB", "train s", "loss_first", "loss_last")


def recipe_comparison(frame, dims_table):
    """Per-task nDCG@10, mean nDCG@10 against width, throughput and peak memory of the recipes."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    trained = frame.dropna(subset=["tokens/s"])
    full = trained[~trained["curve"].str.endswith("PMA projection")]
    shown = full.index.tolist() + (["BM25"] if "BM25" in frame.index else [])
    tasks = [c for c in frame.columns if c not in ("recipe", "dim", "curve", "mean", *TRAINING_COLUMNS)]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2), gridspec_kw={"width_ratios": [3.2, 2.2, 1.2, 1.2]})
    long = frame.loc[shown, tasks].reset_index(names="model").melt(id_vars="model", var_name="task", value_name="v")
    sns.barplot(long, x="task", y="v", hue="model", ax=axes[0])
    axes[0].set(ylabel="nDCG@10", ylim=(0, 100), xlabel="", title="quality per task (full width)")
    axes[0].tick_params(axis="x", rotation=30, labelsize=7)
    axes[0].legend(fontsize=7)
    for curve, row in dims_table.iterrows():
        row = row.dropna()
        axes[1].plot(row.index, row.values, marker="o", label=curve, ls="--" if "projection" in curve else "-")
    axes[1].set_xscale("log", base=2)
    axes[1].set(xlabel="embedding dimension", ylabel="mean nDCG@10", title="quality vs dimension")
    axes[1].legend(fontsize=7)
    sns.barplot(x=trained.index, y=trained["tokens/s"], ax=axes[2], color="tab:blue")
    axes[2].set(title="training throughput", ylabel="real tokens / s", xlabel="")
    sns.barplot(x=trained.index, y=trained["peak memory GB"], ax=axes[3], color="tab:gray")
    axes[3].set(title="peak memory", ylabel="GB", xlabel="")
    for ax in axes[2:]:
        ax.tick_params(axis="x", rotation=60, labelsize=7)
    fig.tight_layout()
    return detached(fig)


def pooling_study(frame, intervals: dict[str, dict]):
    """Mean nDCG@10 per pooler with intervals and seed dots, and projection vs truncation by width."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 1.4]})
    poolers = intervals["poolers"]
    labels = list(poolers)
    values = [poolers[p].value for p in labels]
    errors = [[poolers[p].value - poolers[p].low for p in labels], [poolers[p].high - poolers[p].value for p in labels]]
    axes[0].bar(labels, values, yerr=errors, capsize=6, color="tab:blue", alpha=0.7)
    for x, label in enumerate(labels):
        seeds = [frame.loc[label, c] for c in frame.columns if c.startswith("seed ")]
        axes[0].scatter([x] * len(seeds), seeds, color="black", s=14, zorder=3, label="one seed" if x == 0 else None)
    over = "trainings and queries" if any(i.trainings for i in poolers.values()) else "queries"
    axes[0].set(ylabel="mean nDCG@10 (test)", title=f"pooler (95 % interval over {over})")
    axes[0].legend(fontsize=7)
    for curve, style in (("PMA projection", "--"), ("truncation", "-")):
        found = intervals[curve]
        dims = sorted(found)
        if not dims:
            continue
        axes[1].errorbar(dims, [found[d].value for d in dims], capsize=4, marker="o", ls=style, label=curve,
                         yerr=[[found[d].value - found[d].low for d in dims], [found[d].high - found[d].value
                                                                              for d in dims]])  # fmt: skip
    axes[1].set_xscale("log", base=2)
    widths = sorted({d for curve in ("PMA projection", "truncation") for d in intervals[curve]})
    axes[1].set_xticks(widths, [str(d) for d in widths])
    axes[1].minorticks_off()
    axes[1].set(xlabel="embedding dimension d", ylabel="mean nDCG@10 (test)",
                title="PMA projection to d vs truncation to d")  # fmt: skip
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return detached(fig)
