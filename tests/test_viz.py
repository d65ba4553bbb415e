"""Figures come back as Figure objects; token categories of a known snippet; shares sum to 1."""

import io
import math

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from c2llm_lib.viz import (  # noqa: E402
    CATEGORIES,
    TokenAttention,
    attention_entropy,
    attention_heatmap,
    attention_shares,
    char_categories,
    loss_curves,
    pma_attention,
    position_profile,
    readable_token,
    score_bars,
    token_categories,
)

SNIPPET = 'def area(r):\n    """Circle area."""\n    return 3.14 * r ** 2  # pi r squared\n'


def test_character_categories_of_a_known_snippet():
    cats = char_categories(SNIPPET)
    at = {word: cats[SNIPPET.index(word)] for word in ("def", "area", "(", "Circle", "return", "3.14", "*", "# pi")}
    assert at == {
        "def": "keyword", "area": "identifier", "(": "operator/punctuation", "Circle": "comment/docstring",
        "return": "keyword", "3.14": "literal", "*": "operator/punctuation", "# pi": "comment/docstring",
    }  # fmt: skip
    assert cats[SNIPPET.index("    return")] == "whitespace"
    assert char_categories("x = 'a string'")[5] == "literal"  # a string that is not a statement


def test_token_categories_and_shares(make_encoder):
    enc = make_encoder(pma_heads=4)
    cats = token_categories(enc, SNIPPET)
    items = pma_attention(enc, [SNIPPET], max_tokens=512)
    assert len(cats) == len(items[0].tokens)
    assert cats[0] == "instruction/prefix" and {"keyword", "identifier", "comment/docstring", "literal"} <= set(cats)
    shares = attention_shares(items, [cats])
    assert list(shares.index) == list(CATEGORIES) and shares.sum() == pytest.approx(1.0, abs=1e-5)
    assert position_profile(items).sum() == pytest.approx(1.0, abs=1e-5)
    entropy = attention_entropy(items[0])
    assert entropy.shape == (4,) and np.all(entropy <= math.log(len(cats)) + 1e-6) and np.all(entropy >= 0)


def test_uniform_attention_has_maximal_entropy():
    item = TokenAttention(["a", "b", "c", "d"], np.full((2, 4), 0.25), 0, [False] * 4)
    np.testing.assert_allclose(attention_entropy(item), math.log(4))


def test_figures_are_returned_not_shown(make_encoder):
    enc = make_encoder(pma_heads=4)
    item = pma_attention(enc, [SNIPPET], max_tokens=24)[0]
    assert isinstance(attention_heatmap(item), Figure)
    metrics = [{"step": s, "loss": 3.0 - 0.1 * s, "lr": 1e-4, "dataset": "A" if s % 2 else "B"} for s in range(1, 8)]
    assert isinstance(loss_curves(metrics), Figure)
    frame = pd.DataFrame({"task1": [50.0, 40.0], "task2": [30.0, 20.0]}, index=["model a", "model b"])
    assert isinstance(score_bars(frame), Figure)
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []  # released from pyplot: a notebook shows each figure once
    png = io.BytesIO()
    score_bars(frame).savefig(png, format="png")  # a released figure still draws
    assert png.getvalue().startswith(b"\x89PNG")
    assert readable_token(" x\n") == "\u00b7x\u21b5" and readable_token("") == "\u2205"
    with pytest.raises(ValueError, match="pooling='pma'; this model pools by 'mean'.*--only 01 02 03 04"):
        pma_attention(make_encoder(pooling="mean"), [SNIPPET])
