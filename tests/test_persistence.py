"""save_pretrained / from_pretrained round trips, and loading the released codefuse-ai layout."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from c2llm_lib import C2LLMEncoder
from c2llm_lib.model.released import KEY_RULES, ReleasedCheckpointError, rename_key

from conftest import randomize_lora
from reference_pma import reference_of

TEXTS = ["def add(a, b):\n    return a + b", "SELECT 1;", ""]


@pytest.mark.parametrize(
    "overrides",
    [
        {"pooling": "pma", "pma_heads": 4},
        {"pooling": "pma", "pma_heads": 4, "use_lora": True, "lora_r": 4},
        {"pooling": "last_token", "use_lora": True, "lora_r": 4},
        {"pooling": "mean"},
    ],
    ids=["pma", "pma+lora", "last_token+lora", "mean"],
)
def test_round_trip_gives_identical_embeddings(make_encoder, tmp_path, overrides):
    enc = make_encoder(**overrides)
    if overrides.get("use_lora"):
        randomize_lora(enc)
    before = enc.encode(TEXTS, kind="document")
    enc.save_pretrained(tmp_path / "model")
    assert not list((tmp_path / "model").rglob("*.bin")) and not list((tmp_path / "model").rglob("*.pt"))
    loaded = C2LLMEncoder.from_pretrained(tmp_path / "model", device="cpu")
    np.testing.assert_array_equal(loaded.encode(TEXTS, kind="document"), before)
    assert loaded.config.pooling == enc.config.pooling
    assert (tmp_path / "model" / "adapter").is_dir() == bool(overrides.get("use_lora"))


def test_loaded_adapter_can_keep_training(make_encoder, tmp_path):
    enc = make_encoder(use_lora=True, lora_r=4, pma_heads=4)
    enc.save_pretrained(tmp_path / "m")
    frozen = C2LLMEncoder.from_pretrained(tmp_path / "m")
    assert not any(p.requires_grad for n, p in frozen.backbone.named_parameters())
    trainable = C2LLMEncoder.from_pretrained(tmp_path / "m", trainable=True)
    assert any(p.requires_grad for n, p in trainable.backbone.named_parameters() if "lora_" in n)


def test_save_never_overwrites_silently(make_encoder, tmp_path):
    enc = make_encoder(pooling="mean")
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        enc.save_pretrained(target)
    assert (target / "notes.txt").read_text() == "keep me"
    enc.save_pretrained(target, overwrite=True)
    assert not (target / "notes.txt").exists() and (target / "c2llm_config.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_from_pretrained_names_a_wrong_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="from_released"):
        C2LLMEncoder.from_pretrained(tmp_path)


def write_released_checkpoint(enc, directory, extra=None, drop=None, shards=False):
    """Our tiny encoder's weights written in the released codefuse-ai layout."""
    directory.mkdir()
    base = enc.base_model
    cfg = base.config.to_dict()
    cfg.update(
        architectures=["C2LLMForEmbedding"],
        auto_map={"AutoModel": "modeling_c2llm.C2LLMForEmbedding"},
        model_type="c2llm",
        embedding_method="pma",
        pma_num_heads=enc.pooler.num_heads,
        pma_ln=True,
        pma_norm=False,
        pma_norm_mode="post_normal",
        compressed_dim=enc.pooler.dim,
        padding_side="left",
    )
    (directory / "config.json").write_text(json.dumps(cfg))
    tensors = {f"plm_model.model.{k}": v.clone() for k, v in base.state_dict().items()}
    tensors["plm_model.lm_head.weight"] = base.state_dict()["embed_tokens.weight"].clone()
    tensors["mha_pma.S"] = enc.pooler.seed.detach().clone()
    for k, v in enc.pooler.state_dict().items():
        if k != "seed":
            tensors[f"mha_pma.mab.{k}"] = v.clone()
    tensors.update(extra or {})
    for key in drop or []:
        tensors.pop(key)
    if shards:
        keys = sorted(tensors)
        half = len(keys) // 2
        parts = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
        for name, ks in parts.items():
            save_file({k: tensors[k].contiguous() for k in ks}, directory / name)
        index = {"weight_map": {k: name for name, ks in parts.items() for k in ks}}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "model.safetensors")
    enc.tokenizer.save_pretrained(directory)


@pytest.mark.parametrize("shards", [False, True], ids=["single", "sharded"])
def test_from_released_reproduces_the_released_computation(make_encoder, tmp_path, shards):
    enc = make_encoder(pma_heads=4)
    with torch.no_grad():  # non-trivial LayerNorms so that their mapping is exercised
        enc.pooler.ln0.weight.mul_(1.5)
        enc.pooler.ln1.bias.add_(0.1)
    write_released_checkpoint(enc, tmp_path / "release", shards=shards)
    loaded = C2LLMEncoder.from_released(tmp_path / "release", device="cpu", dtype="float32")
    assert loaded.config.max_length == 2048 and loaded.tokenizer.padding_side == "left"
    np.testing.assert_array_equal(loaded.encode(TEXTS, kind="document"), enc.encode(TEXTS, kind="document"))
    # ... and equals the transcription of the released head on the backbone's hidden states
    batch = loaded.tokenize(TEXTS[:2], "document")
    with torch.no_grad():
        hidden = loaded.hidden_states(**batch)
        expected = reference_of(loaded.pooler, hidden, batch["attention_mask"])
        torch.testing.assert_close(loaded(**batch), expected, rtol=1e-5, atol=1e-5)


def test_from_released_lists_unexpected_and_missing_keys(make_encoder, tmp_path):
    enc = make_encoder(pma_heads=4)
    write_released_checkpoint(
        enc, tmp_path / "bad", extra={"mha_pma.mab.fc_x.weight": torch.zeros(2)}, drop=["mha_pma.mab.ln1.bias"]
    )
    with pytest.raises(ReleasedCheckpointError) as err:
        C2LLMEncoder.from_released(tmp_path / "bad", device="cpu")
    assert "mha_pma.mab.fc_x.weight" in str(err.value) and "pooler.ln1.bias" in str(err.value)


def test_from_released_refuses_other_heads(make_encoder, tmp_path):
    enc = make_encoder(pma_heads=4)
    write_released_checkpoint(enc, tmp_path / "r")
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    (tmp_path / "r" / "config.json").write_text(json.dumps({**cfg, "pma_norm_mode": "pre_gptj"}))
    with pytest.raises(ReleasedCheckpointError, match="pre_gptj"):
        C2LLMEncoder.from_released(tmp_path / "r", device="cpu")
    with pytest.raises(ReleasedCheckpointError, match="config.json"):
        C2LLMEncoder.from_released(tmp_path / "nowhere", device="cpu")


def test_key_table():
    assert rename_key("plm_model.model.layers.0.mlp.up_proj.weight") == "backbone.layers.0.mlp.up_proj.weight"
    assert rename_key("plm_model.lm_head.weight") is None
    assert rename_key("mha_pma.S") == "pooler.seed"
    assert rename_key("mha_pma.mab.fc_o.bias") == "pooler.fc_o.bias"
    with pytest.raises(KeyError):
        rename_key("something.else")
    assert len(KEY_RULES) == 6
