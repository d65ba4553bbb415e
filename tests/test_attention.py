"""PMA attention (c2llm_lib/attention.py): token categories of a known snippet in Python and other languages, shares
sum to 1, entropy, a token fusing the prefix with code, and notebook 05's documents."""

import math

import numpy as np
import pytest

from c2llm_lib.attention import (
    CATEGORIES,
    TokenAttention,
    attention_entropy,
    attention_shares,
    char_categories,
    pma_attention,
    position_profile,
    readable_token,
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


def test_tokens_are_readable_and_a_model_without_pma_has_no_attention(make_encoder):
    assert readable_token(" x\n") == "\u00b7x\u21b5" and readable_token("") == "\u2205"
    with pytest.raises(ValueError, match="pooling='pma'; this model pools by 'mean'.*--only 01 02 03 04"):
        pma_attention(make_encoder(pooling="mean"), [SNIPPET])


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
    from c2llm_lib.attention import code_char_categories

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
    from c2llm_lib.attention import code_char_categories

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
    from c2llm_lib.attention import attention_documents
    from c2llm_lib.data.offline import load_snapshot

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
