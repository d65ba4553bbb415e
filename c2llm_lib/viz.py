"""Figures for the notebooks: training curves, per-task scores, and PMA attention (paper section 3).

Section 3's takeaway is that the PMA query learns which tokens matter (function signatures, key
logic). `pma_attention` returns, for each text, its tokens and the head's weights (H, T) over them,
and `attention_heatmap` draws the mean over heads and a heads x tokens panel. Tokens are shown
readably: byte-level BPE markers are decoded (a space as a middle dot, a newline as a return arrow),
and the document prefix / instruction and special tokens are marked.

Every function returns a matplotlib Figure (or data) and never shows or saves it: `RunDir.save_figure`
writes figures. Figures are released from pyplot (`detached`) before they are returned, so a notebook shows a
figure once, where it displays it, and figures made in a loop do not pile up in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


def detached(fig):
    """`fig`, no longer tracked by pyplot (it still draws, saves and displays)."""
    import matplotlib.pyplot as plt

    plt.close(fig)
    return fig


@dataclass
class TokenAttention:
    tokens: list[str]  # readable token strings
    weights: np.ndarray  # (H, T) PMA attention over the tokens
    prefix_tokens: int  # how many leading tokens belong to the instruction or document prefix
    special: list[bool]  # special tokens (EOS, ...)


def readable_token(text: str) -> str:
    """A token's text with whitespace made visible: space -> middle dot, newline -> return arrow, tab -> arrow."""
    return text.replace(" ", "\u00b7").replace("\n", "\u21b5").replace("\t", "\u21e5") or "\u2205"


def require_pma(encoder) -> None:
    """Attention figures exist only for a PMA head; a last-token or mean-pooled model (a peer recipe) has none."""
    if encoder.config.pooling != "pma":
        raise ValueError(
            f"attention figures need pooling='pma'; this model pools by {encoder.config.pooling!r}, so it has no "
            "PMA attention to show (run its pipeline with --only 01 02 03 04)"
        )


def pma_attention(
    encoder, texts: Sequence[str], kind: str = "document", instruction: str | None = None, max_tokens: int = 80
) -> list[TokenAttention]:
    """PMA attention over each text's own tokens (no padding), truncated to `max_tokens` tokens."""
    require_pma(encoder)
    out = []
    tok = encoder.tokenizer
    for formatted, text in zip(encoder.format_texts(texts, kind, instruction), texts, strict=True):
        batch = encoder.tokenize_formatted([formatted], max_tokens)
        ids = batch["input_ids"][0].tolist()
        prefix_chars = len(formatted) - len(text)
        enc = tok(formatted, add_special_tokens=False, return_offsets_mapping=True, truncation=True,
                  max_length=len(ids))  # fmt: skip
        prefix = sum(1 for start, _ in enc["offset_mapping"] if start < prefix_chars)
        with torch.no_grad():
            _, attn = encoder(**batch, return_attention=True)  # (1, H, T)
        special = set(tok.all_special_ids)
        out.append(TokenAttention(
            tokens=[readable_token(tok.decode([i])) for i in ids],
            weights=attn[0].float().cpu().numpy(),
            prefix_tokens=prefix,
            special=[i in special for i in ids],
        ))  # fmt: skip
    return out


def attention_heatmap(item: TokenAttention, title: str = ""):
    """Two panels: attention averaged over heads, and heads x tokens; prefix and special tokens marked."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    H, T = item.weights.shape
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 0.22 * T), 2.2 + 0.12 * H), sharex=True,
                                      gridspec_kw={"height_ratios": [1, max(2, H // 4)]})  # fmt: skip
    sns.heatmap(item.weights.mean(0, keepdims=True), ax=top, cmap="viridis", cbar=False, yticklabels=["mean"])
    sns.heatmap(item.weights, ax=bottom, cmap="viridis", cbar=False, yticklabels=max(1, H // 8))
    bottom.set_ylabel("head")
    bottom.set_xticks(np.arange(T) + 0.5)
    bottom.set_xticklabels(item.tokens, rotation=90, fontsize=7, family="monospace")
    for i, label in enumerate(bottom.get_xticklabels()):
        if item.special[i]:
            label.set_color("crimson")
        elif i < item.prefix_tokens:
            label.set_color("gray")
    top.set_title(title or "PMA attention (gray: instruction or prefix, red: special tokens)")
    fig.tight_layout()
    return detached(fig)


def loss_curves(metrics: Sequence[dict]):
    """Training loss per step, coloured by the batch's dataset, with the learning rate on a second axis."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    frame = pd.DataFrame(list(metrics))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    sns.scatterplot(frame, x="step", y="loss", hue="dataset", ax=ax, s=18)
    ax.plot(frame["step"], frame["loss"].rolling(5, min_periods=1).mean(), color="black", lw=1, label="mean of 5")
    ax.legend(fontsize=7)
    lr = ax.twinx()
    lr.plot(frame["step"], frame["lr"], color="gray", ls="--", lw=1)
    lr.set_ylabel("learning rate", color="gray")
    ax.set_title("contrastive loss (in-batch + hard negatives)")
    fig.tight_layout()
    return detached(fig)


def score_bars(frame):
    """Per-task nDCG@10 bars for each model, from a models x tasks frame (as `eval.results_frame`)."""
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


CATEGORIES = ("identifier", "keyword", "operator/punctuation", "literal", "comment/docstring", "whitespace",
              "instruction/prefix", "special")  # fmt: skip


def char_categories(code: str) -> list[str]:
    """The category of every character of Python source, from Python's `tokenize` ("whitespace" between
    tokens). A docstring (a string that is a whole statement) counts as comment/docstring."""
    import io
    import keyword
    import tokenize

    cats = ["whitespace"] * len(code)
    starts = [0]
    for line in code.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    previous = tokenize.NEWLINE
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            begin, end = starts[tok.start[0] - 1] + tok.start[1], starts[tok.end[0] - 1] + tok.end[1]
            if tok.type == tokenize.NAME:
                cat = "keyword" if keyword.iskeyword(tok.string) else "identifier"
            elif tok.type == tokenize.OP:
                cat = "operator/punctuation"
            elif tok.type == tokenize.COMMENT:
                cat = "comment/docstring"
            elif tok.type == tokenize.STRING:
                is_statement = previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL)
                cat = "comment/docstring" if is_statement else "literal"
            elif tok.type == tokenize.NUMBER:
                cat = "literal"
            else:
                cat = None
            if cat:
                cats[begin:end] = [cat] * (end - begin)
            if tok.type not in (tokenize.NL, tokenize.COMMENT):
                previous = tok.type
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # a fragment that does not tokenize to the end keeps what was read
    return cats


def token_categories(encoder, text: str, kind: str = "document", instruction: str | None = None,
                     max_tokens: int = 512) -> list[str]:  # fmt: skip
    """The category of each token `pma_attention` shows for `text` (the category of its first non-space
    character; the instruction or document prefix and special tokens are their own categories)."""
    formatted = encoder.format_texts([text], kind, instruction)[0]
    prefix = len(formatted) - len(text)
    ids = encoder.tokenize_formatted([formatted], max_tokens)["input_ids"][0].tolist()
    enc = encoder.tokenizer(formatted, add_special_tokens=False, return_offsets_mapping=True, truncation=True,
                            max_length=max_tokens)  # fmt: skip
    chars = char_categories(text)
    special = set(encoder.tokenizer.all_special_ids)
    cats = []
    for i, tok_id in enumerate(ids):
        if tok_id in special or i >= len(enc["offset_mapping"]):
            cats.append("special")
            continue
        start, end = enc["offset_mapping"][i]
        if start < prefix:
            cats.append("instruction/prefix")
            continue
        span = [chars[c - prefix] for c in range(start, end) if not formatted[c].isspace()]
        cats.append(span[0] if span else "whitespace")
    return cats


def attention_shares(items: Sequence[TokenAttention], categories: Sequence[Sequence[str]]):
    """Share of attention (mean over heads, then over texts) by token category; the shares sum to 1."""
    import pandas as pd

    totals = dict.fromkeys(CATEGORIES, 0.0)
    for item, cats in zip(items, categories, strict=True):
        weights = item.weights.mean(0)  # (T,)
        for w, c in zip(weights, cats, strict=True):
            totals[c] += float(w) / len(items)
    return pd.Series(totals, name="attention share")


def position_profile(items: Sequence[TokenAttention], bins: int = 10):
    """Share of attention by relative position of the token in its text (bins of equal width)."""
    import pandas as pd

    shares = np.zeros(bins)
    for item in items:
        weights = item.weights.mean(0)  # (T,)
        position = np.minimum((np.arange(len(weights)) / len(weights) * bins).astype(int), bins - 1)
        shares += np.bincount(position, weights=weights, minlength=bins) / len(items)
    return pd.Series(shares, index=[f"{i / bins:.1f}-{(i + 1) / bins:.1f}" for i in range(bins)], name="share")


def attention_entropy(item: TokenAttention) -> np.ndarray:
    """Entropy (nats) of each head's attention over the tokens, (H,); log(T) is uniform attention."""
    p = np.clip(item.weights, 1e-12, 1.0)
    return -(p * np.log(p)).sum(-1)


def attention_html(item: TokenAttention, title: str = "") -> str:
    """The text with each token's background shaded by its mean attention (darker = more)."""
    import html

    weights = item.weights.mean(0)
    top = float(weights.max()) or 1.0
    spans = []
    for tok, w, special in zip(item.tokens, weights, item.special, strict=True):
        text = html.escape(tok.replace("\u00b7", " ").replace("\u21b5", "\u21b5\n"))
        border = "border:1px solid crimson;" if special else ""
        spans.append(f'<span title="{w:.4f}" style="background:rgba(68,1,84,{w / top:.2f});{border}">{text}</span>')
    return (f"<html><body><h3>{html.escape(title)}</h3><pre style='font-size:13px;line-height:1.6'>"
            + "".join(spans) + "</pre></body></html>")  # fmt: skip


def dimension_curves(table, hidden: int, dims: Sequence[int]):
    """Mean nDCG@10 against embedding dimension: PMA trained at d versus the full PMA embedding truncated to d
    (rows named as `ablations.variants` and notebook 04 name them)."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    full = table.loc["PMA (trained)", "mean"]
    rows = [{"dim": hidden, "method": m, "mean nDCG@10": full} for m in ("PMA projection to d", "truncation to d")]
    rows += [{"dim": d, "method": "PMA projection to d", "mean nDCG@10": table.loc[f"PMA d={d} (trained)", "mean"]}
             for d in dims]  # fmt: skip
    rows += [{"dim": d, "method": "truncation to d", "mean nDCG@10": table.loc[f"PMA truncated to {d}", "mean"]}
             for d in dims]  # fmt: skip
    fig, ax = plt.subplots(figsize=(6, 3.5))
    sns.lineplot(pd.DataFrame(rows), x="dim", y="mean nDCG@10", hue="method", marker="o", ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_title("embedding dimension: projection (PMA) vs truncation")
    fig.tight_layout()
    return detached(fig)


def recipe_comparison(frame, dims_table):
    """One figure for the recipe comparison (`comparison.comparison_frame` and `dimension_table`): per-task
    nDCG@10 of every recipe at full width (and BM25), mean nDCG@10 against embedding dimension per curve, and
    training throughput and peak memory."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    trained = frame.dropna(subset=["tokens/s"])
    full = trained[~trained["curve"].str.endswith("PMA projection")]
    shown = full.index.tolist() + (["BM25"] if "BM25" in frame.index else [])
    from .comparison import TRAINING_COLUMNS

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
