"""GGUF loading (a tiny GGUF written here) and the split-GGUF fetcher for the real 0.5B backbone."""

import dataclasses
import hashlib
import os
import shutil
import zipfile

import numpy as np
import pytest
import torch

from c2llm_lib import C2LLMEncoder, ModelConfig, downloads
from c2llm_lib.model import TINY_BACKBONE, backbone, converted
from c2llm_lib.model.gguf import GGUFFetchError, SplitGGUF, fetch_qwen_coder_gguf

from gguf_writer import write_qwen2_gguf

TEXTS = ["def add(a, b):\n    return a + b", "for i in range(3): print(i)"]


def test_a_gguf_checkpoint_loads_to_the_same_model(make_encoder, tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("a file where the cache folder should be")  # the converted copy cannot be kept:
    monkeypatch.setenv("C2LLM_CACHE", str(tmp_path / "cache"))  # named, and the model loads all the same
    enc = make_encoder(pooling="mean")
    write_qwen2_gguf(enc.base_model, enc.tokenizer, tmp_path / "tiny.gguf")
    with pytest.warns(UserWarning, match="could not be stored") as caught:
        loaded = C2LLMEncoder.from_config(_gguf_config(tmp_path, "float32"))
    assert len([w for w in caught if "could not be stored" in str(w.message)]) == 2  # the backbone and the tokenizer
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


def _gguf_config(folder, dtype: str) -> ModelConfig:
    return ModelConfig(backbone=str(folder), gguf_file="tiny.gguf", pooling="mean", device="cpu", dtype=dtype,
                       use_lora=False)  # fmt: skip


def _no_conversion(monkeypatch):
    """Makes converting a GGUF (the backbone or the tokenizer) an error."""

    def refused(*args, **kwargs):
        raise AssertionError("the GGUF was converted again")

    tokenizer_load = backbone.AutoTokenizer.from_pretrained
    monkeypatch.setattr(backbone, "_dequantized_gguf", refused)
    monkeypatch.setattr(backbone.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: refused() if k.get("gguf_file") else tokenizer_load(*a, **k))  # fmt: skip


@pytest.fixture(scope="module")
def converted_tiny(tmp_path_factory):
    """(folder with tiny.gguf, its cache, the encoder converted from it in float32): one conversion (~30 s, most of
    it the tokenizer's) for the tests below, which copy the cache before they change it."""
    from conftest import build_tiny

    folder = tmp_path_factory.mktemp("gguf")
    enc = build_tiny(pooling="mean")
    write_qwen2_gguf(enc.base_model, enc.tokenizer, folder / "tiny.gguf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("C2LLM_CACHE", str(folder / "cache"))
        encoder = C2LLMEncoder.from_config(_gguf_config(folder, "float32"))
    return folder, folder / "cache", encoder


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_converted_gguf_is_read_from_the_cache_as_it_was_converted(converted_tiny, tmp_path, monkeypatch, dtype):
    folder, cache, first = converted_tiny
    shutil.copytree(cache, tmp_path / "cache")
    monkeypatch.setenv("C2LLM_CACHE", str(tmp_path / "cache"))
    if dtype == "float32":
        assert sorted(p.name for p in (tmp_path / "cache" / "converted").glob("tiny-*/*")) == [
            "float32",
            "float32.lock",
            "tokenizer",
            "tokenizer.lock",
        ]
        reference = first
    else:  # another dtype: its own copy of the backbone (converted now), the tokenizer's copy shared
        with monkeypatch.context() as patch:
            patch.setattr(backbone.AutoTokenizer, "from_pretrained", _tokenizer_copy_only(patch))
            reference = C2LLMEncoder.from_config(_gguf_config(folder, dtype))
        assert (converted.converted_copy(_gguf_config(folder, dtype), dtype) / "config.json").is_file()
    with monkeypatch.context() as patch:
        _no_conversion(patch)
        read = C2LLMEncoder.from_config(_gguf_config(folder, dtype))
    state, expected = read.base_model.state_dict(), reference.base_model.state_dict()
    assert state.keys() == expected.keys()
    assert all(v.dtype == getattr(torch, dtype) and torch.equal(v, expected[k]) for k, v in state.items())
    assert read.tokenizer(TEXTS)["input_ids"] == reference.tokenizer(TEXTS)["input_ids"]
    assert (read.tokenizer.eos_token_id, read.tokenizer.pad_token_id, read.tokenizer.padding_side) == (
        reference.tokenizer.eos_token_id, reference.tokenizer.pad_token_id, "left")  # fmt: skip
    assert np.array_equal(read.encode(TEXTS), reference.encode(TEXTS))
    assert read.base_loaded_as == reference.base_loaded_as == dtype
    assert read.backbone_config.to_dict() == reference.backbone_config.to_dict()  # its source's name included
    assert read.tokenizer.name_or_path == reference.tokenizer.name_or_path == str(folder)


def _tokenizer_copy_only(monkeypatch):
    load = backbone.AutoTokenizer.from_pretrained

    def only_the_copy(*args, **kwargs):
        assert not kwargs.get("gguf_file"), "the tokenizer was converted again"
        return load(*args, **kwargs)

    return only_the_copy


def test_a_converted_copy_is_keyed_by_the_gguf_and_the_converting_packages(converted_tiny, tmp_path, monkeypatch):
    from conftest import build_tiny

    folder, cache, _ = converted_tiny
    monkeypatch.setenv("C2LLM_CACHE", str(cache))
    shutil.copy(folder / "tiny.gguf", tmp_path / "tiny.gguf")
    cfg = _gguf_config(tmp_path, "float32")
    first = converted.converted_copy(cfg, "float32")
    first_mtime = (tmp_path / "tiny.gguf").stat().st_mtime_ns
    assert first == converted.converted_copy(_gguf_config(folder, "float32"), "float32")  # the content, not the path
    assert (first / "config.json").is_file()
    other = build_tiny(pooling="mean")
    with torch.no_grad():
        other.base_model.norm.weight.add_(1.0)  # another model in a file of the same name
    write_qwen2_gguf(other.base_model, other.tokenizer, tmp_path / "tiny.gguf")
    kept = (tmp_path / "tiny.gguf").stat()
    assert kept.st_size == (folder / "tiny.gguf").stat().st_size
    os.utime(tmp_path / "tiny.gguf", ns=(kept.st_atime_ns, first_mtime))  # the old time kept, as `cp -p` does
    second = converted.converted_copy(cfg, "float32")
    version = converted.importlib.metadata.version
    monkeypatch.setattr(converted.importlib.metadata, "version",
                        lambda name: "9.9" if name == "transformers" else version(name))  # fmt: skip
    third = converted.converted_copy(cfg, "float32")
    assert len({first, second, third}) == 3 and first.parent.parent == cache / "converted"
    assert not second.exists() and not third.exists()  # the changed file is converted, not served the first's copy
    assert converted.converted_copy(dataclasses.replace(cfg, gguf_file=None), "float32") is None
    assert converted.converted_copy(dataclasses.replace(cfg, gguf_file="absent.gguf"), "float32") is None


def test_a_damaged_converted_copy_is_named_and_converted_again(converted_tiny, tmp_path, monkeypatch):
    folder, cache, first = converted_tiny
    shutil.copytree(cache, tmp_path / "cache")
    monkeypatch.setenv("C2LLM_CACHE", str(tmp_path / "cache"))
    cfg = _gguf_config(folder, "float32")
    good = first.encode(TEXTS)
    weights = next(converted.converted_copy(cfg, "float32").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])  # a copy damaged after it was stored
    (converted.converted_copy(cfg, "tokenizer") / "tokenizer.json").unlink()
    with pytest.warns(UserWarning, match=r"converted copy .*no longer matches the digest") as caught:
        again = C2LLMEncoder.from_config(cfg)
    named = " ".join(str(w.message) for w in caught)
    assert all(str(converted.converted_copy(cfg, part)) in named for part in ("float32", "tokenizer"))
    assert np.array_equal(again.encode(TEXTS), good)
    with monkeypatch.context() as patch:  # replaced by a whole copy
        _no_conversion(patch)
        assert np.array_equal(C2LLMEncoder.from_config(cfg).encode(TEXTS), good)


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
