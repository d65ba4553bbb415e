"""C2LLMEncoder on a tiny random Qwen2 with the real tokenizer: prompts, tokens, invariances, bad input."""

import numpy as np
import pytest
import torch

from conftest import right_pad

CODE = [
    "def add(a, b):\n    return a + b",
    "x = 1",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    "    def push(self, item):\n        self.items.append(item)",
    "SELECT name FROM users WHERE id = 3;",
]


@pytest.fixture(scope="module")
def encoders():
    from c2llm_lib import C2LLMEncoder, ModelConfig
    from c2llm_lib.model import TINY_BACKBONE

    built = {}
    for pooling in ("pma", "last_token", "mean"):
        torch.manual_seed(0)
        cfg = ModelConfig(backbone=TINY_BACKBONE, device="cpu", dtype="float32", pooling=pooling, pma_heads=4,
                          use_lora=False)  # fmt: skip
        built[pooling] = C2LLMEncoder.from_config(cfg)
    return built


def test_prompt_formats_follow_the_release(encoders):
    enc = encoders["pma"]
    assert enc.format_texts(["q"], "query", "Find code") == ["Find code\nq"]
    assert enc.format_texts(["q"], "query", "Find code\n") == ["Find code\nq"]
    assert enc.format_texts(["q"], "query") == ["q"]
    assert enc.format_texts(["d"], "document") == ["Retrieved Answer:d"]
    assert enc.format_texts(["d"], "document", "Passage: ") == ["Passage: d"]
    with pytest.raises(ValueError, match="kind"):
        enc.format_texts(["d"], "passage")


def test_tokens_are_left_padded(encoders):
    enc = encoders["pma"]
    batch = enc.tokenize(["a b c d e", "a"], "query")
    mask = batch["attention_mask"]
    assert mask[0].all() and mask[1, -1] == 1 and mask[1, 0] == 0
    assert (batch["input_ids"][mask == 0] == enc.tokenizer.pad_token_id).all()


def test_eos_is_appended_after_truncation_for_last_token(encoders):
    enc = encoders["last_token"]
    eos = enc.tokenizer.eos_token_id
    batch = enc.tokenize(["word " * 500, "short"], "query", max_length=16)
    assert batch["input_ids"].shape[1] == 16
    assert (batch["input_ids"][:, -1] == eos).all()
    free = enc.tokenize(["short"], "query", max_length=16)["input_ids"]
    assert free[0, -1] == eos and (free[0, :-1] != eos).all()
    assert enc.tokenize(["short"], "query")["input_ids"].shape[1] == free.shape[1]
    # PMA (as released) appends nothing.
    assert (encoders["pma"].tokenize(["short"])["input_ids"] != eos).all()


def test_truncation_keeps_the_instruction(encoders):
    enc = encoders["pma"]
    instruction = "Given a code snippet, retrieve its docstring."
    ids = enc.tokenize(["tok " * 400], "query", instruction, max_length=24)["input_ids"][0]
    assert enc.tokenizer.decode(ids).startswith(instruction + "\n")
    assert len(ids) == 24


@pytest.mark.parametrize("pooling", ["pma", "last_token", "mean"])
def test_padding_side_does_not_change_embeddings(encoders, pooling):
    enc = encoders[pooling]
    batch = enc.tokenize(CODE, "document")
    with torch.no_grad():
        left = enc(**batch)
        right = enc(**right_pad(batch, enc.tokenizer.pad_token_id))
    torch.testing.assert_close(left, right, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pooling", ["pma", "last_token", "mean"])
def test_extra_padding_does_not_change_embeddings(encoders, pooling):
    enc = encoders[pooling]
    together = enc.encode(CODE, kind="document", batch_size=4, normalize=False)
    alone = np.concatenate([enc.encode([c], kind="document", normalize=False) for c in CODE])
    np.testing.assert_allclose(together, alone, rtol=1e-4, atol=1e-5)


def test_encode_contract(encoders):
    enc = encoders["pma"]
    out = enc.encode(CODE, kind="document", batch_size=3)
    assert out.dtype == np.float32 and out.shape == (4, enc.embedding_dim)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)
    raw = enc.encode(CODE, kind="document", normalize=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    unsorted = enc.encode(CODE, kind="document", batch_size=3, sort_by_length=False)
    np.testing.assert_allclose(out, unsorted, rtol=1e-4, atol=1e-5)
    reversed_out = enc.encode(CODE[::-1], kind="document", batch_size=3)
    np.testing.assert_allclose(reversed_out[::-1], out, rtol=1e-4, atol=1e-5)
    query = enc.encode(CODE[:1], kind="query", instruction="Find it")
    assert not np.allclose(query, out[:1])


def test_encode_restores_training_mode(encoders):
    enc = encoders["mean"]
    enc.train()
    enc.encode(["x"])
    assert enc.training
    enc.eval()


def test_bad_input(encoders):
    enc = encoders["pma"]
    assert enc.encode([]).shape == (0, enc.embedding_dim)
    empty = enc.encode([""], kind="query")  # no token at all: the seed-only embedding, finite
    assert np.isfinite(empty).all()
    assert np.isfinite(encoders["last_token"].encode([""])).all()  # just the EOS token
    with pytest.raises(TypeError, match="text 1 is int"):
        enc.encode(["ok", 3])
    with pytest.raises(TypeError, match="single str"):
        enc.encode("a string")
    with pytest.raises(TypeError, match="list of texts"):
        enc.encode(None)
    with pytest.raises(ValueError, match="kind"):
        enc.encode(["x"], kind="code")
    with pytest.raises(ValueError, match="batch_size"):
        enc.encode(["x"], batch_size=0)
    for wrong in ("2", 2.5, True):
        with pytest.raises(TypeError, match="batch_size must be an int"):
            enc.encode(["x"], batch_size=wrong)
    long = enc.encode(["word " * 5000], max_length=32)
    assert long.shape == (1, enc.embedding_dim) and np.isfinite(long).all()


def test_attention_weights_for_visualisation(encoders):
    enc = encoders["pma"]
    batch = enc.tokenize(CODE[:2], "document")
    emb, attn = enc(**batch, return_attention=True)
    assert attn.shape == (2, 4, batch["input_ids"].shape[1])
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4))
    with pytest.raises(ValueError, match="pooling='pma'"):
        encoders["mean"](**batch, return_attention=True)


def test_smaller_embedding_dimension(make_encoder):
    enc = make_encoder(pma_heads=4, embedding_dim=16)
    assert enc.encode(["x = 1"]).shape == (1, 16)


def test_a_lone_surrogate_is_named_by_its_index(encoders):
    with pytest.raises(ValueError, match=r"text 1 is not valid Unicode: '\\ud800' at character 2"):
        encoders["mean"].encode(["fine", "ab\ud800cd"])


def test_a_bad_instruction_is_named(encoders):
    enc = encoders["mean"]
    for wrong in (5, b"Find it", ["Find it"]):
        with pytest.raises(TypeError, match=rf"instruction must be a str or None, got {type(wrong).__name__}"):
            enc.encode(["x"], kind="query", instruction=wrong)
    with pytest.raises(ValueError, match=r"the instruction is not valid Unicode: '\\udc80' at character 4"):
        enc.encode(["x"], kind="query", instruction="Find\udc80 it")
    with pytest.raises(TypeError, match="instruction must be a str or None, got int"):
        enc.format_texts(["x"], "document", 3)


def test_the_progress_bar_names_queries_and_documents(encoders, capsys):
    enc = encoders["mean"]
    enc.encode(["a", "b"], kind="query", show_progress=True)
    enc.encode(["a", "b"], kind="document", show_progress=True)
    err = capsys.readouterr().err
    assert "encode queries" in err and "encode documents" in err and "querys" not in err


def test_the_tiny_backbone_is_the_same_model_in_every_dtype():
    # drawn in float32 and cast: torch 2.11 draws other numbers for bf16 tensors than for float32 ones, so a bf16
    # tiny model was another model, and the GPU test comparing bf16 on CUDA with float32 on a CPU compared two
    from c2llm_lib.config import ModelConfig
    from c2llm_lib.model import TINY_BACKBONE
    from c2llm_lib.model.backbone import load_backbone

    fp32 = load_backbone(ModelConfig(backbone=TINY_BACKBONE, device="cpu", dtype="float32", use_lora=False))
    bf16 = load_backbone(ModelConfig(backbone=TINY_BACKBONE, device="cpu", dtype="bfloat16", use_lora=False))
    for (name, a), (_, b) in zip(fp32.named_parameters(), bf16.named_parameters(), strict=True):
        assert b.dtype == torch.bfloat16 and torch.equal(a.to(torch.bfloat16), b), name
