"""Figures come back as Figure objects; token categories of a known snippet; shares sum to 1; the loss title names
each recipe's loss; truncation is recorded; heatmaps are coloured relative to uniform attention."""

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

from c2llm_lib.checks import ConfigError  # noqa: E402
from c2llm_lib.config import TrainConfig  # noqa: E402
from c2llm_lib.params import load_params  # noqa: E402
from c2llm_lib.viz import (  # noqa: E402
    CATEGORIES,
    TokenAttention,
    attention_entropy,
    attention_heatmap,
    attention_html,
    attention_shares,
    char_categories,
    loss_curves,
    pma_attention,
    position_profile,
    readable_token,
    score_bars,
    token_categories,
    truncation_summary,
)

PARAMS = Path(__file__).resolve().parent.parent / "params"

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


def test_a_token_fusing_the_prefix_with_code_counts_as_code(make_encoder):
    enc = make_encoder(pma_heads=4)  # the real Qwen2.5-Coder tokenizer (c2llm_lib/assets)
    item = pma_attention(enc, [SNIPPET], max_tokens=512)[0]
    assert item.tokens[:4] == ["Ret", "rieved", "\u00b7Answer", ":def"]  # "Retrieved Answer:" + "def" fused
    assert item.prefix_tokens == 3  # the tokens wholly inside the prefix
    cats = token_categories(enc, SNIPPET)
    assert cats[:4] == ["instruction/prefix"] * 3 + ["keyword"]  # ":def" is the keyword def
    query = token_categories(enc, "def f(): pass", kind="query", instruction="Find the code.\n")
    assert query == ["instruction/prefix"] * 4 + ["keyword", "identifier", "operator/punctuation", "keyword"]


# token categories of the languages mined from your code, and notebook 05's documents ----------------------------
GO = 'func Clamp(v int) string {\n\t// the café of v\n\treturn fmt.Sprint("é", v + 1, true)\n}\n'


def test_other_languages_are_classed_by_their_own_grammar_known_answer():
    from c2llm_lib.viz import code_char_categories

    cats = code_char_categories(GO, "go")
    assert len(cats) == len(GO)
    at = {word: cats[GO.index(word)] for word in ("func", "Clamp", "(", "int", "// the", "return", "fmt", '"é"',
                                                  "1", "true", "+")}  # fmt: skip
    assert at == {
        "func": "keyword", "Clamp": "identifier", "(": "operator/punctuation", "int": "identifier",
        "// the": "comment/docstring", "return": "keyword", "fmt": "identifier", '"é"': "literal", "1": "literal",
        "true": "literal", "+": "operator/punctuation",
    }  # fmt: skip
    assert cats[GO.index("v + 1")] == "identifier"  # the characters after a non-ASCII one stay aligned
    assert cats[GO.index("\treturn")] == "whitespace"
    php = "function add($a) {\n    return $a + 1;\n}"  # parsed after PHP's opening tag, which it lacks
    php_cats = code_char_categories(php, "php")
    assert php_cats[0] == "keyword" and php_cats[php.index("add")] == "identifier" and php_cats[-1] != "whitespace"
    java = "int half(int n) { return n / 2; }"
    assert code_char_categories(java, "java")[0] == "keyword"  # a built-in type name is a word of the grammar
    assert code_char_categories(SNIPPET, "python") == char_categories(SNIPPET)  # Python keeps its own tokenize


def test_a_language_with_no_scheme_is_left_out_of_the_shares(make_encoder):
    from c2llm_lib.viz import code_char_categories

    assert code_char_categories("SELECT 1", "sql") is None and code_char_categories("some prose", "mixed") is None
    enc = make_encoder(pma_heads=4)
    assert token_categories(enc, "some prose", language="mixed") is None
    texts = [SNIPPET, "some prose"]
    items = pma_attention(enc, texts, max_tokens=512)
    cats = [token_categories(enc, SNIPPET), None]
    shares = attention_shares(items, cats)
    np.testing.assert_allclose(shares.to_numpy(), attention_shares(items[:1], cats[:1]).to_numpy())  # prose ignored
    assert attention_shares(items[1:], [None]).isna().all()  # nothing classed: no shares, not zeros


def test_attention_documents_span_the_languages_whole_functions_first():
    from c2llm_lib.data.offline import load_snapshot
    from c2llm_lib.viz import attention_documents

    def row(dataset, language, positive):
        return {"dataset": dataset, "language": language, "positive": positive, "query": "q"}

    heldout = [row("CodeSearchNetCCRetrieval", "go", "go rest"), row("CodeSearchNetRetrieval", "python", "py 1"),
               row("CodeSearchNetRetrieval", "python", "py 2"), row("CodeSearchNetRetrieval", "go", "go 1"),
               row("CodeSearchNetRetrieval", "python", "py 1"), row("own-pairs", "mixed", "an answer")]  # fmt: skip
    assert attention_documents(heldout) == [("go 1", "go"), ("an answer", "mixed"), ("py 1", "python"),
                                            ("py 2", "python"), ("go rest", "go")]  # fmt: skip
    offline = attention_documents(None)  # the default run's corpus, as before: held-out Python functions
    first = next(r for r in load_snapshot() if r["split"] == "test" and r["dataset"] == "CodeSearchNetRetrieval"
                 and r["language"] == "python")  # fmt: skip
    assert offline[0] == (first["positive"], "python") and {language for _, language in offline} == {"python"}
