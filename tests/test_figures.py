"""Figures (c2llm_lib/figures.py) come back as Figure objects; the loss title names each recipe's loss; truncation is
recorded; heatmaps and the HTML view are coloured relative to uniform attention."""

import dataclasses
import io
import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from c2llm_lib.attention import (  # noqa: E402
    TokenAttention,
    attention_entropy,
    pma_attention,
    position_profile,
    truncation_summary,
)
from c2llm_lib.checks import ConfigError  # noqa: E402
from c2llm_lib.config import TrainConfig  # noqa: E402
from c2llm_lib.figures import attention_heatmap, attention_html, loss_curves, score_bars  # noqa: E402
from c2llm_lib.params import load_params  # noqa: E402

PARAMS = Path(__file__).resolve().parent.parent / "params"

SNIPPET = 'def area(r):\n    """Circle area."""\n    return 3.14 * r ** 2  # pi r squared\n'


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


def recipe(name: str) -> TrainConfig:
    """The TrainConfig of a params file (its training keys over the defaults)."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in load_params(PARAMS / f"{name}.yaml").items() if k in names})


def title_of(fig) -> str:
    return fig._suptitle.get_text() if fig._suptitle else " ".join(ax.get_title() for ax in fig.axes)


def test_the_loss_title_names_the_loss_each_recipe_trained():
    metrics = [{"step": s, "loss": 3.0 - 0.1 * s, "lr": 1e-4, "dataset": "A"} for s in range(1, 8)]
    c2llm = title_of(loss_curves(metrics, recipe("c2llm-0.5b")))
    assert "in-batch negatives over the global batch of 256 + K = 7 hard negatives, tau = 0.05" in c2llm
    assert "Matryoshka" not in c2llm
    assert "one joint softmax over the global batch of 1024 and K = 7" in title_of(
        loss_curves(metrics, recipe("codexembed-style"))
    )
    jina_metrics = [{**m, "loss@896": 2.0, "loss@512": 2.1, "loss@256": 2.2, "loss@128": 2.4, "loss@64": 2.8}
                    for m in metrics]  # fmt: skip
    fig = loss_curves(jina_metrics, recipe("jina-code-0.5b").to_dict())  # the dict form too
    jina = title_of(fig)
    assert jina.startswith("Matryoshka loss over widths [full, 512, 256, 128, 64] of: ")
    assert "in-batch negatives only (K = 0)" in jina and "hard negatives" not in jina
    curves = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
    assert {"loss@896", "loss@512", "loss@256", "loss@128", "loss@64"} <= curves  # one curve per width
    assert "recipe not given" in title_of(loss_curves(metrics))  # the one-argument call still works
    with pytest.raises(ConfigError, match="unknown parameter 'temperature'"):
        loss_curves(metrics, {"temperature": 0.05})


def test_truncated_texts_say_so(make_encoder):
    enc = make_encoder(pma_heads=4)
    whole, cut = pma_attention(enc, [SNIPPET], max_tokens=512)[0], pma_attention(enc, [SNIPPET], max_tokens=12)[0]
    assert not whole.truncated and whole.full_tokens == len(whole.tokens)
    assert cut.truncated and len(cut.tokens) == 12 and cut.full_tokens == len(whole.tokens)
    assert truncation_summary([whole, cut]) == {"texts": 2, "truncated": 1, "max_tokens_shown": len(whole.tokens),
                                                "median_full_tokens": len(whole.tokens),
                                                "max_full_tokens": len(whole.tokens)}  # fmt: skip
    # a text cut to its first 10 of 40 tokens, attending uniformly: positions are read in the whole text
    item = TokenAttention(list("abcdefghij"), np.full((2, 10), 0.1), 0, [False] * 10, full_tokens=40)
    assert position_profile([item], bins=4).tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0])
    assert "truncated: first 12 of" in attention_heatmap(cut).axes[0].get_title()
    assert f"Truncated: only the first 12 of {cut.full_tokens} tokens" in attention_html(cut)
    with pytest.raises(ValueError, match="full_tokens=5 is fewer than the 10 tokens"):
        TokenAttention(list("abcdefghij"), np.full((2, 10), 0.1), 0, [False] * 10, full_tokens=5)


def near_uniform(T: int = 30, H: int = 8) -> TokenAttention:
    """Attention within 2% of uniform (entropy 0.9998 of log T), as a fresh PMA head gives."""
    weights = (1 + 0.02 * np.random.default_rng(0).uniform(-1, 1, (H, T))) / T
    return TokenAttention([f"t{i}" for i in range(T)], weights / weights.sum(-1, keepdims=True), 0, [False] * T)


def test_heatmap_colours_attention_relative_to_uniform():
    item = near_uniform()
    assert attention_entropy(item).mean() / math.log(30) > 0.9998
    fig = attention_heatmap(item)
    images = [image for ax in fig.axes for image in ax.get_images()]
    assert len(images) == 2  # the mean strip and heads x tokens
    for image in images:  # one fixed log scale, centred at 1 = uniform, for both panels
        assert (image.norm.vmin, image.norm.vmax) == pytest.approx((1 / 8, 8))
        rgba = image.to_rgba(image.get_array())  # (rows, T, 4)
        white = image.to_rgba(np.array([[1.0]]))[0, 0]
        assert np.abs(rgba - white).max() < 0.03  # near-uniform attention reads as uniform, not as structure
    np.testing.assert_allclose(images[1].get_array(), item.weights * 30)
    colorbar = fig.axes[-1]
    assert "attention x T" in colorbar.get_ylabel()
    assert "1 = uniform" in [label.get_text() for label in colorbar.get_yticklabels()]
    peaked = np.full((1, 4), 0.1)
    peaked[0, 0] = 0.7  # 2.8 x uniform on the first token, 0.4 x on the others
    image = attention_heatmap(TokenAttention(list("abcd"), peaked, 0, [False] * 4)).axes[1].get_images()[0]
    red, blue = image.to_rgba(image.get_array())[0, :2]
    assert red[0] > red[2] and blue[2] > blue[0]  # more than uniform is red, less is blue


def test_html_shades_attention_relative_to_uniform():
    alphas = [float(a) for a in re.findall(r"background:rgba\(\d+,\d+,\d+,([\d.]+)\)", attention_html(near_uniform()))]
    assert len(alphas) == 30 and max(alphas) < 0.02  # uniform attention is unshaded
    peaked = np.array([[0.7, 0.1, 0.1, 0.1]])
    page = attention_html(TokenAttention(list("abcd"), peaked, 0, [False] * 4))
    assert "rgba(178,24,43,0.50)" in page and "rgba(33,102,172,0.44)" in page  # log(2.8)/log(8), log(0.4)/log(8)
    assert "uniform" in page
