"""save_pretrained / from_pretrained round trips, and loading the released codefuse-ai layout."""

import json

import numpy as np
import pytest
import torch

from c2llm_lib import C2LLMEncoder
from c2llm_lib.model.released import KEY_RULES, ReleasedCheckpointError, rename_key

from conftest import randomize_lora
from reference_pma import reference_of
from released_fixture import write_released_checkpoint

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


# hostile or damaged files: safetensors only, and every problem named ---------------------------------------------
def test_a_pickled_release_is_refused(make_encoder, tmp_path):
    from safetensors.torch import load_file

    from c2llm_lib.files import CorruptFile

    write_released_checkpoint(make_encoder(pma_heads=4), tmp_path / "r")
    weights = tmp_path / "r" / "model.safetensors"
    torch.save(load_file(weights), tmp_path / "r" / "pytorch_model.bin")
    weights.unlink()
    with pytest.raises(CorruptFile, match="pytorch_model.bin.*pickle"):
        C2LLMEncoder.from_released(tmp_path / "r", device="cpu")


def test_a_missing_backbone_tensor_is_an_error_listing_it(make_encoder, tmp_path):
    from safetensors.torch import load_file, save_file

    make_encoder(pooling="mean").save_pretrained(tmp_path / "m")
    weights = tmp_path / "m" / "backbone" / "model.safetensors"
    tensors = load_file(weights)
    del tensors["layers.1.mlp.up_proj.weight"]
    save_file(tensors, weights)
    with pytest.raises(ValueError, match=r"missing keys \['layers.1.mlp.up_proj.weight'\]"):
        C2LLMEncoder.from_pretrained(tmp_path / "m")


@pytest.mark.parametrize("damaged", ["backbone/model.safetensors", "pooler.safetensors"])
def test_a_truncated_weights_file_is_named(make_encoder, tmp_path, damaged):
    from c2llm_lib.files import CorruptFile

    make_encoder(pma_heads=4).save_pretrained(tmp_path / "m")
    path = tmp_path / "m" / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CorruptFile, match=damaged.split("/")[-1] + ".*corrupt or truncated"):
        C2LLMEncoder.from_pretrained(tmp_path / "m")


def test_a_missing_tokenizer_folder_is_named(make_encoder, tmp_path):
    import shutil

    make_encoder(pooling="mean").save_pretrained(tmp_path / "m")
    shutil.rmtree(tmp_path / "m" / "tokenizer")
    with pytest.raises(FileNotFoundError, match="tokenizer folder is missing"):
        C2LLMEncoder.from_pretrained(tmp_path / "m")


# what a directory holds, not only that it exists ----------------------------------------------------------------
def test_an_adapter_pickle_is_refused_unread(make_encoder, tmp_path):
    """peft would load `adapter_model.bin` (a pickle) where the safetensors file is missing, or beside it."""
    from safetensors.torch import load_file

    from c2llm_lib.files import CorruptFile

    enc = make_encoder(pma_heads=4, use_lora=True, lora_r=4)
    randomize_lora(enc)
    enc.save_pretrained(tmp_path / "m")
    adapter = tmp_path / "m" / "adapter"
    torch.save(load_file(adapter / "adapter_model.safetensors"), adapter / "adapter_model.bin")
    with pytest.raises(CorruptFile, match=r"adapter.*adapter_model.bin.*pickle"):  # beside the safetensors file
        C2LLMEncoder.from_pretrained(tmp_path / "m")
    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(CorruptFile, match=r"adapter_model.bin.*pickle"):  # in its place
        C2LLMEncoder.from_pretrained(tmp_path / "m")


def test_a_pickle_in_place_of_any_weights_file_is_named(make_encoder, tmp_path):
    from safetensors.torch import load_file

    from c2llm_lib.files import CorruptFile

    make_encoder(pooling="mean").save_pretrained(tmp_path / "m")
    weights = tmp_path / "m" / "backbone" / "model.safetensors"
    torch.save(load_file(weights), weights.with_name("pytorch_model.bin"))
    weights.unlink()
    with pytest.raises(CorruptFile, match=r"model.safetensors.*missing.*pytorch_model.bin.*pickle"):
        C2LLMEncoder.from_pretrained(tmp_path / "m")


def test_a_tokenizer_folder_without_its_vocabulary_is_named(make_encoder, tmp_path):
    """Without tokenizer.json, transformers builds a 2-token tokenizer from tokenizer_config.json alone: every text
    then gets the same embedding."""
    make_encoder(pma_heads=4).save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"m/tokenizer: holds no tokenizer vocabulary.*tokenizer_config.json"):
        C2LLMEncoder.from_pretrained(tmp_path / "m")


def test_an_empty_tokenizer_folder_is_named(make_encoder, tmp_path):
    import shutil

    make_encoder(pooling="mean").save_pretrained(tmp_path / "m")
    shutil.rmtree(tmp_path / "m" / "tokenizer")
    (tmp_path / "m" / "tokenizer").mkdir()
    with pytest.raises(FileNotFoundError, match=r"m/tokenizer: holds no tokenizer vocabulary.*it holds nothing"):
        C2LLMEncoder.from_pretrained(tmp_path / "m")


def test_a_tokenizer_must_fit_the_backbones_embedding(make_encoder):
    from c2llm_lib.model.backbone import TOKENIZER_ASSET, load_saved_tokenizer

    config = make_encoder(pooling="mean").backbone_config
    assert len(load_saved_tokenizer(TOKENIZER_ASSET, config, 151936)) == 151936  # the real Qwen2.5 pair
    with pytest.raises(ValueError, match=r"151,936 entries, but the backbone embeds 1,000 .*ids past the last"):
        load_saved_tokenizer(TOKENIZER_ASSET, config, 1000)
    with pytest.raises(ValueError, match=r"151,936 entries, but the backbone embeds 400,000 tokens: it is not"):
        load_saved_tokenizer(TOKENIZER_ASSET, config, 400_000)


@pytest.mark.parametrize("damaged", ["backbone/model.safetensors", "pooler.safetensors", "adapter"])
def test_non_finite_weights_are_refused_naming_the_file(make_encoder, tmp_path, damaged):
    from safetensors.torch import load_file, save_file

    from c2llm_lib.files import CorruptFile

    make_encoder(pma_heads=4, use_lora=True, lora_r=4).save_pretrained(tmp_path / "m")
    path = tmp_path / "m" / (damaged if damaged != "adapter" else "adapter/adapter_model.safetensors")
    tensors = load_file(path)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, path)
    with pytest.raises(CorruptFile, match=rf"{path.name}: .*non-finite.*{name}"):
        C2LLMEncoder.from_pretrained(tmp_path / "m")


@pytest.mark.parametrize(
    ("change", "problem"),
    [({"pma_heads": 2}, r"pooler.safetensors holds the weights of the head .*differ in \['pma_heads'\]"),
     ({"pooling": "mean"}, r"pooler.safetensors holds the weights of the head .*differ in .*'pooling'"),
     ({"pma_score_scale": "per_head"}, r"differ in \['pma_score_scale'\]")],
    ids=["heads", "pooling", "scale"],
)  # fmt: skip
def test_a_config_that_describes_another_head_is_refused(make_encoder, tmp_path, change, problem):
    """The head count and score scale cannot be read from the weights: a changed c2llm_config.json would load the
    same tensors into a different model."""
    from c2llm_lib.files import CorruptFile

    make_encoder(pma_heads=4).save_pretrained(tmp_path / "m")
    record_path = tmp_path / "m" / "c2llm_config.json"
    record = json.loads(record_path.read_text())
    record["model"].update(change)
    record_path.write_text(json.dumps(record))
    with pytest.raises(CorruptFile, match=problem):
        C2LLMEncoder.from_pretrained(tmp_path / "m")


def test_a_lora_encoder_without_its_adapter_folder_is_refused(make_encoder, tmp_path):
    import shutil

    make_encoder(pma_heads=4, use_lora=True, lora_r=4).save_pretrained(tmp_path / "m")
    shutil.rmtree(tmp_path / "m" / "adapter")
    with pytest.raises(FileNotFoundError, match=r"use_lora=True, but .*adapter is missing"):
        C2LLMEncoder.from_pretrained(tmp_path / "m")


def test_from_released_warns_of_nothing(make_encoder, tmp_path):
    """transformers read the release's config.json (model type c2llm) for the tokenizer and warned that the load
    'can yield errors'."""
    import logging

    class Records(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    write_released_checkpoint(make_encoder(pma_heads=4), tmp_path / "r")
    records, logger = Records(), logging.getLogger("transformers")
    logger.addHandler(records)
    try:
        C2LLMEncoder.from_released(tmp_path / "r", device="cpu", dtype="float32")
    finally:
        logger.removeHandler(records)
    assert not [m for m in records.messages if "You are using a model of type" in m], records.messages


def test_non_finite_released_weights_are_refused(make_encoder, tmp_path):
    from c2llm_lib.files import CorruptFile

    write_released_checkpoint(
        make_encoder(pma_heads=4), tmp_path / "r", extra={"mha_pma.S": torch.full((1, 1, 64), torch.inf)}
    )
    with pytest.raises(CorruptFile, match=r"model.safetensors: .*non-finite.*mha_pma.S"):
        C2LLMEncoder.from_released(tmp_path / "r", device="cpu")


# where and how a directory is written ------------------------------------------------------------------------------
def test_saving_into_a_symlinked_folder_writes_where_it_points(make_encoder, tmp_path):
    enc = make_encoder(pooling="mean")
    (tmp_path / "disk").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "disk")
    enc.save_pretrained(tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "disk" / "c2llm_config.json").is_file()
    enc.save_pretrained(tmp_path / "link", overwrite=True)  # replaced where it points; the link stays
    assert (tmp_path / "link").is_symlink() and (tmp_path / "disk" / "c2llm_config.json").is_file()
    np.testing.assert_array_equal(C2LLMEncoder.from_pretrained(tmp_path / "link").encode(TEXTS), enc.encode(TEXTS))
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"dangling is a symlink to .*nowhere, which does not exist"):
        enc.save_pretrained(tmp_path / "dangling")
    (tmp_path / "file").write_text("mine")
    with pytest.raises(FileExistsError, match=r"file exists and is a file, not a folder"):
        enc.save_pretrained(tmp_path / "file", overwrite=True)
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_saved_folders_follow_the_umask(make_encoder, tmp_path, umask):
    """tempfile.mkdtemp made every saved model private (0700; safetensors files 0600), unreadable to colleagues."""
    import os
    import stat

    from c2llm_lib.export import save_export
    from c2llm_lib.train import save_checkpoint

    enc = make_encoder(pma_heads=4, use_lora=True, lora_r=4)
    merged = make_encoder(pma_heads=4)
    old = os.umask(umask)
    try:
        enc.save_pretrained(tmp_path / "merged")
        save_checkpoint(tmp_path / "step-1", enc)
        save_export(merged, tmp_path / "export", "a model card")
    finally:
        os.umask(old)
    for folder in ("merged", "step-1", "export"):
        for path in [tmp_path / folder, *(tmp_path / folder).rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode == (0o777 if path.is_dir() else 0o666) & ~umask, (path, oct(mode))
