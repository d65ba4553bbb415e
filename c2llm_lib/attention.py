"""PMA attention statistics (paper section 3; notebook 05): each text's attention over its tokens, token categories by
each language's own parser, and shares by category, position and entropy (docs/evaluation.md#attention-notebook-05)."""

from __future__ import annotations

import io
import keyword
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .data.grammars import GRAMMARS, parser_for
from .data.offline import load_snapshot
from .prompts import HELDOUT_RECIPES


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
    """(prompted text, token ids cut as `encode` cuts them, each token's character span (None for an appended EOS),
    prefix length in characters, full token count)."""
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
    """PMA attention over each text's own tokens, cut to `max_tokens`, recording `full_tokens` and `truncated`."""
    require_pma(encoder)
    return [_token_attention(encoder, text, None, kind, instruction, max_tokens, n) for n, text in enumerate(texts)]


def stored_attention(
    encoder, text: str, weights: np.ndarray, kind: str = "document", instruction: str | None = None,
    max_tokens: int = 80,
) -> TokenAttention:  # fmt: skip
    """A `TokenAttention` of earlier (H, T) or (T,) weights over `text`'s tokens; another T is refused."""
    return _token_attention(encoder, text, np.asarray(weights, dtype=np.float32), kind, instruction, max_tokens)


def _token_attention(encoder, text: str, weights: np.ndarray | None, kind: str, instruction: str | None,
                     max_tokens: int, n: int = 0) -> TokenAttention:  # fmt: skip
    """`text`'s readable tokens with `weights`, or with the PMA head's attention over them when `weights` is None."""
    _, ids, offsets, prefix_chars, full_tokens = tokenize_with_offsets(encoder, text, kind, instruction, max_tokens)
    if weights is None:
        if not ids:
            raise ValueError(f"pma_attention: text {n} ({text[:40]!r}) has no tokens, even with its prompt")
        batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        with torch.no_grad():
            _, attn = encoder(**batch, return_attention=True)  # (1, H, T)
        weights = attn[0].float().cpu().numpy()  # (H, T)
    weights = weights[None, :] if weights.ndim == 1 else weights  # (H, T)
    if weights.ndim != 2 or weights.shape[1] != len(ids):
        raise ValueError(f"stored_attention: {weights.shape[-1]} weights for the {len(ids)} tokens this encoder gives "
                         f"the text at {max_tokens} tokens ({text[:40]!r}): computed with another tokenizer, prompt "
                         "or length")  # fmt: skip
    tok = encoder.tokenizer
    special = set(tok.all_special_ids)
    return TokenAttention(
        tokens=[readable_token(tok.decode([i])) for i in ids],
        weights=weights,  # (H, T)
        prefix_tokens=sum(1 for o in offsets if o is not None and o[1] <= prefix_chars),
        special=[i in special for i in ids],
        full_tokens=full_tokens,
    )


def attention_documents(heldout=None) -> list[tuple[str, str]]:
    """(text, language) of notebook 05's documents: a run's held-out positives, else offline ones."""
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
    """The category of every character of Python source by `tokenize`; a docstring counts as comment/docstring."""
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
    """A tree-sitter leaf's category: comment, literal, identifier, keyword, else operator/punctuation."""
    kind = node.type.lower()
    if node.is_named and "comment" in kind:
        return "comment/docstring"
    if (node.is_named and any(w in kind for w in LITERAL_NODES)) or kind in LITERAL_WORDS or text[:1] in "\"'`":
        return "literal"
    if node.is_named and ("identifier" in kind or kind in ("name", "constant")):
        return "identifier"
    return "keyword" if text.isidentifier() else "operator/punctuation"


def grammar_char_categories(code: str, language: str) -> list[str] | None:
    """The category of every character of `code` by `language`'s tree-sitter grammar; None without a grammar."""
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
    """Character categories by `tokenize` for Python, a tree-sitter grammar for other mined languages, else None."""
    return char_categories(code) if language == "python" else grammar_char_categories(code, language)


def token_categories(encoder, text: str, kind: str = "document", instruction: str | None = None,
                     max_tokens: int = 512, language: str = "python") -> list[str] | None:  # fmt: skip
    """Each token's category: "instruction/prefix" wholly inside the prefix, "special", else its code part's first
    non-space character's; None without a scheme."""
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
    """Attention share by token category, summing to 1; texts without categories are left out."""
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
    """Attention share by relative position in the whole text (equal bins); a cut text is placed in its full length."""
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
    """Entropy (nats) of each head's attention over the T tokens the model saw, (H,); log(T) is uniform attention."""
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
