"""Figures for the notebooks: training curves, per-task scores, and PMA attention (paper section 3).

Section 3's takeaway is that the PMA query learns which tokens matter (function signatures, key
logic). `pma_attention` returns, for each text, its tokens and the head's weights (H, T) over them, and
whether the text was cut to `max_tokens` (with its full length), so that statistics over a corpus can say so.
`attention_heatmap` draws the mean over heads and a heads x tokens panel, coloured by weight x T on one fixed
scale centred at 1 (uniform attention over the T tokens), so that near-uniform attention looks uniform. Tokens
are shown readably: byte-level BPE markers are decoded (a space as a middle dot, a newline as a return arrow),
and the document prefix / instruction and special tokens are marked. A token belongs to the prefix only if its
characters lie wholly inside it: byte-level BPE fuses the prefix's last character with the first code token
(`:def`), and such a token counts as code.

`attention_spans` is the shaded code alone (the `<pre>` of `attention_html`), and `stored_attention` rebuilds a
`TokenAttention` from weights computed earlier (notebook 07's search index keeps each function's), checking they
count the text's tokens.

Over a corpus (`attention_documents`: a files or code run's own held-out documents, any language, else the offline
snapshot's held-out Python functions) the attention is shared out by token category. Python is read by Python's
`tokenize` (`char_categories`); the other languages mined from code by their tree-sitter grammar (`data.grammars`),
whose leaf nodes give the same categories (`grammar_char_categories`): one scheme per language from that language's
own parser, never Python's rules applied to Go. A text in a language with neither (a files run's "mixed" rows) has no
categories and is left out of the shares, which say how many texts they cover.

`loss_curves` titles the training loss with the loss the recipe trained (section 4.1's in-batch + hard-negative
InfoNCE, an in-batch-only or joint-softmax variant, or a Matryoshka sum over widths) and draws per-width curves.

Every function returns a matplotlib Figure (or data) and never shows or saves it: `RunDir.save_figure`
writes figures. Figures are released from pyplot (`detached`) before they are returned, so a notebook shows a
figure once, where it displays it, and figures made in a loop do not pile up in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .config import TrainConfig, from_dict
from .data.grammars import GRAMMARS, parser_for
from .data.offline import load_snapshot
from .prompts import HELDOUT_RECIPES


def detached(fig):
    """`fig`, no longer tracked by pyplot (it still draws, saves and displays)."""
    import matplotlib.pyplot as plt

    plt.close(fig)
    return fig


@dataclass
class TokenAttention:
    tokens: list[str]  # readable token strings, the T tokens the model saw
    weights: np.ndarray  # (H, T) PMA attention over the tokens
    prefix_tokens: int  # how many leading tokens lie wholly inside the instruction or document prefix
    special: list[bool]  # special tokens (EOS, ...)
    full_tokens: int | None = None  # tokens of the whole prompted text before truncation; None: T (not cut)

    def __post_init__(self) -> None:
        T = len(self.tokens)
        if self.weights.ndim != 2 or self.weights.shape[1] != T or len(self.special) != T:
            raise ValueError(f"TokenAttention: weights {self.weights.shape} and {len(self.special)} special flags "
                             f"do not match {T} tokens (weights must be (H, T))")  # fmt: skip
        self.full_tokens = T if self.full_tokens is None else self.full_tokens
        if self.full_tokens < T:
            raise ValueError(f"TokenAttention: full_tokens={self.full_tokens} is fewer than the {T} tokens shown")

    @property
    def truncated(self) -> bool:
        """Whether the text was cut: the model saw fewer tokens than the whole text has."""
        return self.full_tokens > len(self.tokens)


def tokenize_with_offsets(encoder, text: str, kind: str, instruction: str | None, max_tokens: int):
    """The prompted text, the token ids the model gets for it (truncated to `max_tokens`, as `encode` does), each
    token's character span in the prompted text (None for an appended EOS), the prefix's length in characters,
    and how many tokens the whole prompted text has (EOS included when appended)."""
    formatted = encoder.format_texts([text], kind, instruction)[0]
    batch = encoder.tokenize_formatted([formatted], max_tokens)
    ids = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()  # (T,) real tokens only
    full = encoder.tokenizer(formatted, add_special_tokens=False, return_offsets_mapping=True)
    eos = 1 if encoder.config.eos_appended else 0
    offsets = [tuple(o) for o in full["offset_mapping"][: len(ids) - eos]] + [None] * eos
    return formatted, ids, offsets, len(formatted) - len(text), len(full["input_ids"]) + eos


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
    """PMA attention over each text's own tokens (no padding), truncated to `max_tokens` tokens; each item
    records the full text's length (`full_tokens`) and whether it was cut (`truncated`)."""
    require_pma(encoder)
    out = []
    tok = encoder.tokenizer
    special = set(tok.all_special_ids)
    for n, text in enumerate(texts):
        _, ids, offsets, prefix_chars, full_tokens = tokenize_with_offsets(encoder, text, kind, instruction,
                                                                           max_tokens)  # fmt: skip
        if not ids:
            raise ValueError(f"pma_attention: text {n} ({text[:40]!r}) has no tokens, even with its prompt")
        batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        with torch.no_grad():
            _, attn = encoder(**batch, return_attention=True)  # (1, H, T)
        out.append(_token_attention(tok, special, ids, offsets, prefix_chars, full_tokens,
                                    attn[0].float().cpu().numpy()))  # (H, T)  # fmt: skip
    return out


def _token_attention(tok, special: set[int], ids: list[int], offsets: list, prefix_chars: int, full_tokens: int,
                     weights: np.ndarray) -> TokenAttention:  # fmt: skip
    return TokenAttention(
        tokens=[readable_token(tok.decode([i])) for i in ids],
        weights=weights,  # (H, T)
        prefix_tokens=sum(1 for o in offsets if o is not None and o[1] <= prefix_chars),
        special=[i in special for i in ids],
        full_tokens=full_tokens,
    )


def stored_attention(
    encoder, text: str, weights: np.ndarray, kind: str = "document", instruction: str | None = None,
    max_tokens: int = 80,
) -> TokenAttention:  # fmt: skip
    """A `TokenAttention` for attention computed earlier over `text`'s tokens (e.g. kept in a search index): weights
    (H, T) or (T,) (one row, e.g. the mean over heads), for the T tokens `encode` gives the text at `max_tokens`. A
    count of weights that is not T (another tokenizer, prompt or length) is an error."""
    _, ids, offsets, prefix_chars, full_tokens = tokenize_with_offsets(encoder, text, kind, instruction, max_tokens)
    weights = np.asarray(weights, dtype=np.float32)
    weights = weights[None, :] if weights.ndim == 1 else weights  # (H, T)
    if weights.ndim != 2 or weights.shape[1] != len(ids):
        raise ValueError(f"stored_attention: {weights.shape[-1]} weights for the {len(ids)} tokens this encoder gives "
                         f"the text at {max_tokens} tokens ({text[:40]!r}): computed with another tokenizer, prompt "
                         "or length")  # fmt: skip
    tok = encoder.tokenizer
    return _token_attention(tok, set(tok.all_special_ids), ids, offsets, prefix_chars, full_tokens, weights)


UNIFORM_RANGE = 8.0  # the heatmaps' colour scale runs from 1/8 to 8 times uniform attention


def relative_to_uniform(weights: np.ndarray) -> np.ndarray:
    """Attention weights (..., T) times T: 1 is uniform attention over the T tokens, 2 twice uniform."""
    return weights * weights.shape[-1]


def _uniform_norm():
    """The shared colour scale: log, from 1/UNIFORM_RANGE to UNIFORM_RANGE, so 1 (uniform) sits in the middle."""
    from matplotlib.colors import LogNorm

    return LogNorm(vmin=1 / UNIFORM_RANGE, vmax=UNIFORM_RANGE)


def attention_heatmap(item: TokenAttention, title: str = ""):
    """Two panels: attention averaged over heads, and heads x tokens; prefix and special tokens marked. Colour is
    weight x T on one log scale shared by both panels and every figure: white is uniform attention (1/T on each
    token), red more, blue less, saturated at UNIFORM_RANGE times more or less."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter

    H, T = item.weights.shape
    norm = _uniform_norm()
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
    """The training loss a recipe (a `config.TrainConfig` or its dict) optimises, in words: section 4.1's
    in-batch InfoNCE over the global batch plus a hard-negative InfoNCE over 1 + K candidates at tau, its
    in-batch-only form (K = 0), one joint softmax, and the Matryoshka sum over widths (`losses.py`). K is the one
    the trainer used (`negatives_used`: the recipe's K, at most what any row holds) when given, saying so where it
    differs from the recipe's, and `short_rows` rows with fewer than K negatives (scored over those they have)."""
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
    """Training loss per step, coloured by the batch's dataset, with the learning rate on a second axis; titled
    with the loss `train` (a `config.TrainConfig` or its dict) names, when given, with the K the trainer used
    (`negatives_used`) and the rows that held fewer (the steps' `short_of_k`). Steps that logged per-width
    Matryoshka losses (`loss@d`) get a second panel with one curve per width."""
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


def attention_documents(heldout=None) -> list[tuple[str, str]]:
    """(text, language) of the held-out documents notebook 05 draws attention over. With a run's held-out split
    (`data/heldout` of a files or code run, a Dataset or rows) its distinct positives: whole documents before a code
    run's code->code continuations (fragments of a function), and within each the languages in turn, so that the
    first few examples span them. Without one, the offline snapshot's held-out Python functions (the corpus of
    the default run's figures)."""
    if heldout is None:
        wanted = ("test", "CodeSearchNetRetrieval", "python")
        return [(r["positive"], "python") for r in load_snapshot()
                if (r["split"], r["dataset"], r["language"]) == wanted]  # fmt: skip

    columns = ["dataset", "language", "positive"]
    rows = heldout.select_columns(columns).to_list() if hasattr(heldout, "select_columns") else list(heldout)
    tiers: list[dict[str, list[str]]] = [{}, {}]  # [whole documents, continuations]: language -> texts
    seen: set[str] = set()
    for row in rows:
        if row["positive"] not in seen:
            seen.add(row["positive"])
            tier = tiers[row["dataset"] == HELDOUT_RECIPES["code2code"]]
            tier.setdefault(row["language"], []).append(row["positive"])
    out = []
    for tier in tiers:
        queues = [[(text, language) for text in texts] for language, texts in sorted(tier.items())]
        for turn in range(max(map(len, queues), default=0)):
            out += [queue[turn] for queue in queues if turn < len(queue)]
    return out


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


LITERAL_NODES = ("string", "char", "number", "integer", "float", "literal", "escape", "rune", "regex", "heredoc")
LITERAL_WORDS = ("true", "false", "nil", "null", "none", "undefined")
PARSE_PREFIX = {"php": "<?php\n"}  # a PHP function parses as PHP only after the opening tag


def _leaves(node):
    if node.child_count == 0:
        yield node
    for child in node.children:
        yield from _leaves(child)


def _leaf_category(node, text: str) -> str:
    """The category of one tree-sitter leaf: comments, literals (string, number, character nodes, their quotes, and
    true/false/nil/null), identifiers (any `*identifier` node, a name or constant), keywords (any other word: the
    grammar's keywords, `this`/`self`, and built-in type names such as `int` or `i32`), else operator/punctuation."""
    kind = node.type.lower()
    if node.is_named and "comment" in kind:
        return "comment/docstring"
    if (node.is_named and any(w in kind for w in LITERAL_NODES)) or kind in LITERAL_WORDS or text[:1] in "\"'`":
        return "literal"
    if node.is_named and ("identifier" in kind or kind in ("name", "constant")):
        return "identifier"
    return "keyword" if text.isidentifier() else "operator/punctuation"


def grammar_char_categories(code: str, language: str) -> list[str] | None:
    """The category of every character of `code` from the leaves of its parse by `language`'s tree-sitter grammar
    (`data.grammars`, the grammars that mine your code; `_leaf_category`), "whitespace" between leaves; None for a
    language with no grammar there. A fragment (a code->code continuation) parses with error nodes, whose leaves are
    classified all the same."""
    grammar = next((g for g in GRAMMARS if g.language == language), None)
    if grammar is None:
        return None
    prefix = PARSE_PREFIX.get(language, "").encode()
    source = prefix + code.encode()
    char_of = [i for i, ch in enumerate(code) for _ in ch.encode()] + [len(code)]  # byte -> character index
    cats = ["whitespace"] * len(code)
    parser, _ = parser_for(grammar)
    for leaf in _leaves(parser.parse(source).root_node):
        begin, end = max(leaf.start_byte - len(prefix), 0), max(leaf.end_byte - len(prefix), 0)
        if end <= begin:
            continue
        first, last = char_of[begin], char_of[end]
        category = _leaf_category(leaf, source[leaf.start_byte : leaf.end_byte].decode(errors="replace"))
        cats[first:last] = [category] * (last - first)
    return cats


def code_char_categories(code: str, language: str) -> list[str] | None:
    """The category of every character of `code`: Python's own `tokenize` for Python (`char_categories`), the
    language's tree-sitter grammar for the other languages mined from code (`grammar_char_categories`), and None
    for a language with neither (a files run's "mixed" rows, SQL, prose): no scheme pretends to read it."""
    return char_categories(code) if language == "python" else grammar_char_categories(code, language)


def token_categories(encoder, text: str, kind: str = "document", instruction: str | None = None,
                     max_tokens: int = 512, language: str = "python") -> list[str] | None:  # fmt: skip
    """The category of each token `pma_attention` shows for `text`, from character offsets: a token lying wholly
    inside the instruction or document prefix is "instruction/prefix"; any other token takes the category of the
    first non-space character of its code part (a token fusing the prefix's end with code, as `:def`, counts as
    code); special tokens are "special". The characters' categories come from `code_char_categories` for the
    text's `language`; None when that language has no scheme."""
    chars = code_char_categories(text, language)
    if chars is None:
        return None
    formatted, ids, offsets, prefix, _ = tokenize_with_offsets(encoder, text, kind, instruction, max_tokens)
    special = set(encoder.tokenizer.all_special_ids)
    cats = []
    for tok_id, span in zip(ids, offsets, strict=True):
        if tok_id in special or span is None:
            cats.append("special")
            continue
        start, end = span
        if end <= prefix:
            cats.append("instruction/prefix")
            continue
        code = [chars[c - prefix] for c in range(max(start, prefix), end) if not formatted[c].isspace()]
        cats.append(code[0] if code else "whitespace")
    return cats


def attention_shares(items: Sequence[TokenAttention], categories: Sequence[Sequence[str] | None]):
    """Share of attention (mean over heads, then over texts) by token category; the shares sum to 1. The shares
    are over the tokens each text was cut to (`truncation_summary` says how many texts were cut). A text whose
    categories are None (a language with no scheme, `token_categories`) is left out; with none left every share is
    NaN."""
    import pandas as pd

    kept = [(item, cats) for item, cats in zip(items, categories, strict=True) if cats is not None]
    totals = dict.fromkeys(CATEGORIES, 0.0 if kept else float("nan"))
    for item, cats in kept:
        if len(cats) != len(item.tokens):
            raise ValueError(f"attention_shares: {len(cats)} categories for {len(item.tokens)} tokens "
                             "(token_categories and pma_attention need the same max_tokens)")  # fmt: skip
        weights = item.weights.mean(0)  # (T,)
        for w, c in zip(weights, cats, strict=True):
            totals[c] += float(w) / len(kept)
    return pd.Series(totals, name="attention share")


def position_profile(items: Sequence[TokenAttention], bins: int = 10):
    """Share of attention by relative position of the token in its whole text (bins of equal width). A text
    cut to its first T tokens is placed in its full length, not stretched: its bins past the cut get nothing
    (an appended EOS stays at the end)."""
    import pandas as pd

    shares = np.zeros(bins)
    for item in items:
        weights = item.weights.mean(0)  # (T,)
        index = np.arange(len(weights))  # (T,) token positions in the whole text
        if item.truncated and item.special[-1]:
            index[-1] = item.full_tokens - 1  # the EOS appended after the cut ends the text
        position = np.minimum((index / item.full_tokens * bins).astype(int), bins - 1)
        shares += np.bincount(position, weights=weights, minlength=bins) / len(items)
    return pd.Series(shares, index=[f"{i / bins:.1f}-{(i + 1) / bins:.1f}" for i in range(bins)], name="share")


def attention_entropy(item: TokenAttention) -> np.ndarray:
    """Entropy (nats) of each head's attention over the tokens the model saw, (H,); log(T) is uniform attention
    over those T tokens (fewer than the text's `full_tokens` when it was truncated)."""
    p = np.clip(item.weights, 1e-12, 1.0)
    return -(p * np.log(p)).sum(-1)


def truncation_summary(items: Sequence[TokenAttention]) -> dict:
    """How many texts were cut to fit `max_tokens`, and how long the texts were (tokens, prefix included)."""
    full = np.array([item.full_tokens for item in items])
    return {
        "texts": len(items),
        "truncated": sum(item.truncated for item in items),
        "max_tokens_shown": max((len(item.tokens) for item in items), default=0),
        "median_full_tokens": float(np.median(full)) if len(full) else 0.0,
        "max_full_tokens": int(full.max()) if len(full) else 0,
    }


def attention_html(item: TokenAttention, title: str = "") -> str:
    """The text with each token's background shaded by its mean attention relative to uniform (weight x T, on the
    heatmaps' log scale): no shade is uniform attention, red more, blue less, full colour at UNIFORM_RANGE
    times more or less."""
    import html

    T = len(item.tokens)
    cut = f" Truncated: only the first {T} of {item.full_tokens} tokens were used." if item.truncated else ""
    legend = (f"Shade: attention relative to uniform (1/{T} per token): none = uniform, red = more, blue = less, "
              f"full colour at {UNIFORM_RANGE:g}x more or less. Hover a token for its weight.{cut}")  # fmt: skip
    return (f"<html><body><h3>{html.escape(title)}</h3><p>{html.escape(legend)}</p>"
            + attention_spans(item) + "</body></html>")  # fmt: skip


def attention_spans(item: TokenAttention, style: str = "font-size:13px;line-height:1.6") -> str:
    """The `<pre>` of `attention_html`: each token in a span shaded by its mean attention relative to uniform (red
    more, blue less, full colour at UNIFORM_RANGE times), its weight in the span's title; special tokens boxed."""
    import html

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


# the training's columns of `comparison.comparison_frame` (the others are the recipe, its curve, and nDCG@10 per task)
TRAINING_COLUMNS = ("tokens/s", "peak memory GB", "train s", "loss_first", "loss_last")


def recipe_comparison(frame, dims_table):
    """One figure for the recipe comparison (`comparison.comparison_frame` and `dimension_table`): per-task
    nDCG@10 of every recipe at full width (and BM25), mean nDCG@10 against embedding dimension per curve, and
    training throughput and peak memory."""
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
    """The pooling study's figure (`ablations.pooling_frame`, `ablations.mean_intervals`). Left: mean nDCG@10 per
    pooler with its 95 % bootstrap interval (over trainings and queries where the intervals hold several seeds, else
    over queries; the title says which), and each seed's mean as a dot. Right: mean nDCG@10 against the embedding
    width, PMA trained to project to d against the full PMA embedding truncated to d, with intervals; every width is
    a tick."""
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
