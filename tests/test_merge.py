"""Weighted checkpoint merge: [1, 0, 0, 0] is checkpoint 1, identical checkpoints merge to themselves,
merged weights are W_base + sum_i w_i Delta_i (not peft's averaged factors)."""

import numpy as np
import pytest
import torch

from c2llm_lib import C2LLMEncoder
from c2llm_lib.merge import check_weights, checked_checkpoints, lora_factors, merge_as_adapter, merge_checkpoints
from c2llm_lib.train import encoder_from_checkpoint, save_checkpoint

from conftest import TINY_LORA, build_tiny, randomize_lora

TEXTS = ["def add(a, b):\n    return a + b", "SELECT 1;"]


def lora_deltas(checkpoint) -> dict[str, torch.Tensor]:
    """Dense float32 updates (alpha / r) * B @ A of one checkpoint, keyed by the base weight's name."""
    scale, factors = lora_factors(checkpoint)
    return {name: scale * (b @ a) for name, (a, b) in factors.items()}  # (out, r) @ (r, in) -> (out, in)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    paths = []
    for i in range(4):
        enc = build_tiny(seed=i, **TINY_LORA)
        randomize_lora(enc, seed=10 + i)
        paths.append(save_checkpoint(root / f"step-{i}", enc))
    return paths


def test_weight_one_reproduces_checkpoint_one(checkpoints):
    merged = merge_checkpoints(checkpoints, [1, 0, 0, 0]).encoder
    reference = encoder_from_checkpoint(checkpoints[0], device="cpu")
    dense = reference.backbone.merge_and_unload()  # peft's own W + scale * B @ A
    for name, value in dense.state_dict().items():
        assert torch.equal(merged.base_model.state_dict()[name], value), name
    for name, value in reference.pooler.state_dict().items():
        assert torch.equal(merged.pooler.state_dict()[name], value), name
    reference = encoder_from_checkpoint(checkpoints[0], device="cpu")
    np.testing.assert_allclose(merged.encode(TEXTS), reference.encode(TEXTS), rtol=1e-5, atol=1e-6)


def test_identical_checkpoints_merge_to_themselves(checkpoints):
    same = [checkpoints[1]] * 3
    merged = merge_checkpoints(same, [0.2, 0.3, 0.5]).encoder
    alone = merge_checkpoints([checkpoints[1]], [1.0]).encoder
    for name, value in alone.state_dict().items():
        torch.testing.assert_close(merged.state_dict()[name], value, rtol=1e-6, atol=1e-7, msg=name)


def test_merged_weights_are_the_weighted_sum_of_dense_deltas(checkpoints):
    weights = [0.1, 0.2, 0.3, 0.4]
    merged = merge_checkpoints(checkpoints, weights).encoder
    base = merge_checkpoints(checkpoints[:1], [1.0]).encoder.base_model.state_dict()
    deltas = [lora_deltas(p) for p in checkpoints]
    assert "layers.0.self_attn.q_proj.weight" in deltas[0]
    for name in deltas[0]:
        expected = (base[name] - deltas[0][name]) + sum(w * d[name] for w, d in zip(weights, deltas, strict=True))
        torch.testing.assert_close(merged.base_model.state_dict()[name], expected, rtol=1e-5, atol=1e-6)
        # peft's "linear" combination would average the factors instead: a different matrix
        from safetensors.torch import load_file

    a = [load_file(p / "adapter" / "adapter_model.safetensors") for p in checkpoints]
    key = next(k for k in a[0] if "q_proj.lora_A" in k)
    wa = sum(w * t[key] for w, t in zip(weights, a, strict=True))
    wb = sum(w * t[key.replace("lora_A", "lora_B")] for w, t in zip(weights, a, strict=True))
    averaged_factors = 2.0 * (wb @ wa)
    true_update = sum(w * d["layers.0.self_attn.q_proj.weight"] for w, d in zip(weights, deltas, strict=True))
    assert not torch.allclose(averaged_factors, true_update, atol=1e-4)


def test_each_weight_gets_the_summed_update_added_once(checkpoints):
    """Bit for bit: the checkpoints' weighted updates are summed first and added to the base weight once (one rounding
    into the weight), as when every dense update was held at once; the merge now builds them a module at a time."""
    weights = [0.1, 0.2, 0.3, 0.4]
    merged = merge_checkpoints(checkpoints, weights).encoder.base_model.state_dict()
    trained = checked_checkpoints(checkpoints, weights, "cpu")[3]
    base = C2LLMEncoder.from_config(trained).base_model.float().state_dict()
    deltas = [lora_deltas(p) for p in checkpoints]
    for name in deltas[0]:
        total = 0
        for w, delta in zip(weights, deltas, strict=True):
            total = total + w * delta[name]
        assert torch.equal(merged[name], base[name] + total), name
    untouched = next(k for k in base if k.endswith("norm.weight"))
    assert torch.equal(merged[untouched], base[untouched])


def test_pma_head_is_averaged(checkpoints):
    from safetensors.torch import load_file

    weights = [0.25, 0.25, 0.25, 0.25]
    merged = merge_checkpoints(checkpoints, weights).encoder
    heads = [load_file(p / "pooler.safetensors") for p in checkpoints]
    torch.testing.assert_close(merged.pooler.seed.detach(), sum(h["seed"] for h in heads) / 4)


def test_weights_are_validated_and_normalised_with_a_note(checkpoints, tmp_path):
    assert check_weights([1, 1], 2) == ([0.5, 0.5], "weights [1, 1] sum to 2; normalised to [0.5, 0.5]")
    result = merge_checkpoints(checkpoints[:2], [2, 2])
    assert result.weights == [0.5, 0.5] and "normalised" in result.note
    with pytest.raises(ValueError, match="non-negative"):
        check_weights([1, -0.5], 2)
    with pytest.raises(ValueError, match="one weight per checkpoint"):
        check_weights([1], 2)
    with pytest.raises(ValueError, match="all zero"):
        check_weights([0, 0], 2)
    with pytest.raises(FileNotFoundError, match="not a training checkpoint"):
        merge_checkpoints([tmp_path], [1])


def test_the_merged_model_is_a_standalone_directory(checkpoints, tmp_path):
    merged = merge_checkpoints(checkpoints, [0.4, 0.3, 0.2, 0.1]).encoder
    before = merged.encode(TEXTS)
    merged.save_pretrained(tmp_path / "merged")
    assert not (tmp_path / "merged" / "adapter").exists()
    np.testing.assert_array_equal(C2LLMEncoder.from_pretrained(tmp_path / "merged").encode(TEXTS), before)


# the same merge as one low-rank adapter (what notebooks 04 and 05 evaluate) ---------------------------------------
def test_the_adapter_form_is_the_dense_merge(checkpoints, tmp_path):
    weights = [0.4, 0.3, 0.2, 0.1]
    dense = merge_checkpoints(checkpoints, weights).encoder
    result = merge_as_adapter(checkpoints, weights)
    low_rank = result.encoder
    assert result.weights == weights and low_rank.config.lora_r == 4 * TINY_LORA["lora_r"] == low_rank.config.lora_alpha
    assert not any(p.requires_grad for p in low_rank.backbone.parameters())
    np.testing.assert_allclose(low_rank.encode(TEXTS), dense.encode(TEXTS), rtol=1e-5, atol=1e-6)
    for name, value in dense.pooler.state_dict().items():
        assert torch.equal(low_rank.pooler.state_dict()[name], value), name
    unloaded = low_rank.backbone.merge_and_unload().state_dict()  # peft's W + B @ A of the stacked factors
    for name, value in dense.base_model.state_dict().items():
        torch.testing.assert_close(unloaded[name], value, rtol=1e-5, atol=1e-6, msg=name)
    low_rank = merge_as_adapter(checkpoints, weights).encoder
    low_rank.save_pretrained(tmp_path / "merged")
    assert (tmp_path / "merged" / "adapter").is_dir()
    reloaded = C2LLMEncoder.from_pretrained(tmp_path / "merged")
    np.testing.assert_array_equal(reloaded.encode(TEXTS), low_rank.encode(TEXTS))


# bf16 training: the merge must keep an update smaller than bf16's resolution ---------------------------------
BF16_TEXTS = TEXTS + ["x = 1", "class Stack:\n    def push(self, item):\n        self.items.append(item)"]


def small_lora(encoder, seed: int, scale: float = 2e-4) -> None:
    """LoRA B of a short run's size: the dense updates (~1e-4) are near or below half a bf16 ulp of the weights."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in encoder.backbone.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)


@pytest.fixture(scope="module")
def bf16_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16")
    paths = []
    for i in range(4):
        enc = build_tiny(seed=i, dtype="bfloat16", **TINY_LORA)
        assert next(enc.base_model.parameters()).dtype == torch.bfloat16
        small_lora(enc, seed=20 + i)
        paths.append(save_checkpoint(root / f"step-{i}", enc))
    return paths


def test_bf16_merge_keeps_the_whole_update(bf16_checkpoints):
    weights = [0.1, 0.2, 0.3, 0.4]
    merged = merge_checkpoints(bf16_checkpoints, weights).encoder
    base = build_tiny(dtype="bfloat16").base_model.state_dict()  # the base weights training saw
    after = merged.base_model.state_dict()
    deltas = [lora_deltas(p) for p in bf16_checkpoints]
    for name in deltas[0]:
        expected = sum(w * d[name] for w, d in zip(weights, deltas, strict=True))  # (out, in), float32
        update = after[name].float() - base[name].float()
        assert (update - expected).norm() <= 1e-3 * expected.norm(), name
    assert after["layers.0.self_attn.q_proj.weight"].dtype == torch.float32 and merged.config.dtype == "float32"


def test_bf16_merge_with_weight_one_reproduces_checkpoint_one(bf16_checkpoints, tmp_path):
    merged = merge_checkpoints(bf16_checkpoints, [1, 0, 0, 0]).encoder
    trained = encoder_from_checkpoint(bf16_checkpoints[0], device="cpu")  # bf16 base + LoRA, as trained
    assert next(trained.base_model.parameters()).dtype == torch.bfloat16
    ours = merged.encode(BF16_TEXTS)
    as_trained = trained.encode(BF16_TEXTS)
    assert ((ours * as_trained).sum(1) >= 0.9999).all()
    # bf16 arithmetic alone moves the tiny model's embeddings by 1 - cos ~ 2e-5, as much as a lost update does;
    # the same weights (bf16 base + LoRA, upcast exactly) in float32 arithmetic see the update itself.
    exact = trained.float().encode(BF16_TEXTS)
    assert ((ours * exact).sum(1) >= 1 - 1e-6).all(), (ours * exact).sum(1)
    merged.save_pretrained(tmp_path / "merged")
    reloaded = C2LLMEncoder.from_pretrained(tmp_path / "merged")  # the stored dtype unless told otherwise
    assert next(reloaded.base_model.parameters()).dtype == torch.float32
    np.testing.assert_array_equal(reloaded.encode(BF16_TEXTS), ours)
    asked = C2LLMEncoder.from_pretrained(tmp_path / "merged", dtype="bfloat16")
    assert next(asked.base_model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("weights", [[1e308, 1e308], [float("inf"), 1.0], [float("nan"), 1.0]])
def test_non_finite_or_overflowing_weights_are_refused(checkpoints, weights):
    with pytest.raises(ValueError, match="finite|overflow"):
        check_weights(weights, 2)
    with pytest.raises(ValueError, match="finite|overflow"):
        merge_checkpoints(checkpoints[:2], weights)


@pytest.mark.parametrize("setting", [{"prompt_style": "jina"}, {"document_prefix": "Code: "}])
def test_checkpoints_trained_with_different_prompts_are_refused(checkpoints, tmp_path, setting):
    enc = build_tiny(seed=5, **TINY_LORA, **setting)
    other = save_checkpoint(tmp_path / "other", enc)
    ((key, value),) = setting.items()
    with pytest.raises(ValueError, match=key) as err:
        merge_checkpoints([checkpoints[0], other], [0.5, 0.5])
    assert str(checkpoints[0]) in str(err.value) and str(other) in str(err.value) and repr(value) in str(err.value)


def test_a_corrupt_adapter_file_is_named(checkpoints, tmp_path):
    import shutil

    from c2llm_lib.files import CorruptFile

    broken = tmp_path / "broken"
    shutil.copytree(checkpoints[1], broken)
    weights_file = broken / "adapter" / "adapter_model.safetensors"
    weights_file.write_bytes(weights_file.read_bytes()[:200])
    with pytest.raises(CorruptFile, match="adapter_model.safetensors"):
        merge_checkpoints([checkpoints[0], broken], [0.5, 0.5])


def test_the_bf16_adapter_form_keeps_the_whole_update(bf16_checkpoints):
    """Over the bf16 base training saw, the stacked float32 factors hold sum_i w_i Delta_i exactly, and the model
    computes as the checkpoints did (bf16 base + adapter), close to the exact float32 arithmetic."""
    weights = [0.1, 0.2, 0.3, 0.4]
    low_rank = merge_as_adapter(bf16_checkpoints, weights).encoder
    assert next(low_rank.base_model.parameters()).dtype == torch.bfloat16
    deltas = [lora_deltas(p) for p in bf16_checkpoints]
    params = dict(low_rank.backbone.named_parameters())
    for name in deltas[0]:
        prefix = "base_model.model." + name.removesuffix(".weight")
        a, b = params[f"{prefix}.lora_A.default.weight"], params[f"{prefix}.lora_B.default.weight"]
        assert a.dtype == b.dtype == torch.float32
        expected = sum(w * d[name] for w, d in zip(weights, deltas, strict=True))  # (out, in)
        torch.testing.assert_close(b @ a, expected, rtol=1e-5, atol=1e-9, msg=name)
    dense = merge_checkpoints(bf16_checkpoints, weights).encoder  # float32 weights and arithmetic
    cosine = (low_rank.encode(BF16_TEXTS) * dense.encode(BF16_TEXTS)).sum(1)
    assert (cosine >= 0.9999).all(), cosine


def test_merged_holds_the_low_rank_form_after_bf16_training_and_the_dense_one_after_float32(
    checkpoints, bf16_checkpoints
):
    from c2llm_lib.merge import evaluation_form

    dense = merge_checkpoints(checkpoints, [0.5, 0.5, 0, 0])
    assert dense.base is None  # float32 training keeps no second copy of the base
    assert evaluation_form(checkpoints, [0.5, 0.5, 0, 0], dense) is dense.encoder  # no adapter matmuls
    bf16_dense = merge_checkpoints(bf16_checkpoints, [0.5, 0.5, 0, 0])
    low_rank = evaluation_form(bf16_checkpoints, [0.5, 0.5, 0, 0], bf16_dense)
    assert low_rank.config.use_lora and next(low_rank.base_model.parameters()).dtype == torch.bfloat16


def test_the_adapter_form_is_built_on_the_dense_merges_copy_of_the_base_without_loading_it_again(
    bf16_checkpoints, monkeypatch
):
    from c2llm_lib import C2LLMEncoder
    from c2llm_lib.merge import evaluation_form

    weights = [0.1, 0.2, 0.3, 0.4]
    loaded = merge_as_adapter(bf16_checkpoints, weights).encoder  # its own base, loaded as configured
    dense = merge_checkpoints(bf16_checkpoints, weights)
    base = dense.base
    assert next(base.base_model.parameters()).dtype == torch.bfloat16  # the base as trained, not the upcast one
    assert next(dense.encoder.base_model.parameters()).dtype == torch.float32
    with monkeypatch.context() as patch:
        patch.setattr(C2LLMEncoder, "from_config", lambda cfg: pytest.fail("the backbone was loaded again"))
        handed = evaluation_form(bf16_checkpoints, weights, dense)
    assert dense.base is None and handed.backbone.get_base_model() is base.backbone  # handed over, not kept twice
    ours, theirs = handed.backbone.state_dict(), loaded.backbone.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(v, theirs[k]) for k, v in ours.items())
    assert all(torch.equal(v, loaded.pooler.state_dict()[k]) for k, v in handed.pooler.state_dict().items())
    np.testing.assert_array_equal(handed.encode(BF16_TEXTS), loaded.encode(BF16_TEXTS))
    again = evaluation_form(bf16_checkpoints, weights, dense)  # the copy was handed over: the base is loaded again
    np.testing.assert_array_equal(again.encode(BF16_TEXTS), loaded.encode(BF16_TEXTS))


def test_the_adapter_form_refuses_uneven_or_patterned_ranks_naming_the_checkpoint(checkpoints, tmp_path):
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    uneven = tmp_path / "uneven"
    shutil.copytree(checkpoints[1], uneven)
    weights_file = uneven / "adapter" / "adapter_model.safetensors"
    tensors = load_file(weights_file)
    key = next(k for k in tensors if "q_proj.lora_A" in k)
    tensors[key] = tensors[key][:2].contiguous()
    tensors[key.replace("lora_A", "lora_B")] = tensors[key.replace("lora_A", "lora_B")][:, :2].contiguous()
    save_file(tensors, weights_file)
    with pytest.raises(ValueError, match="rank 2 where the adapter's other modules have 4") as err:
        merge_as_adapter([checkpoints[0], uneven], [0.5, 0.5])
    assert str(uneven) in str(err.value)
    patterned = tmp_path / "patterned"
    shutil.copytree(checkpoints[1], patterned)
    config_file = patterned / "adapter" / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "rank_pattern": {"q_proj": 2}}))
    with pytest.raises(ValueError, match="rank_pattern"):
        merge_as_adapter([checkpoints[0], patterned], [0.5, 0.5])


@pytest.mark.parametrize("damage", ["pickle", "nan head"])
def test_a_pickled_adapter_or_a_non_finite_head_is_named(checkpoints, tmp_path, damage):
    """An adapter_model.bin in place of the safetensors file was reported as a missing file; a NaN head merged into
    NaN embeddings."""
    import shutil

    from safetensors.torch import load_file, save_file

    from c2llm_lib.files import CorruptFile

    broken = tmp_path / "broken"
    shutil.copytree(checkpoints[1], broken)
    if damage == "pickle":
        weights = broken / "adapter" / "adapter_model.safetensors"
        torch.save(load_file(weights), weights.with_suffix(".bin"))
        weights.unlink()
        problem = r"adapter_model.safetensors: .*missing, and adapter_model.bin lies in its place: a pickle"
    else:
        head = load_file(broken / "pooler.safetensors")
        head["seed"] = torch.full_like(head["seed"], float("nan"))
        save_file(head, broken / "pooler.safetensors")
        problem = r"broken/pooler.safetensors: .*non-finite.*seed"
    with pytest.raises(CorruptFile, match=problem):
        merge_checkpoints([checkpoints[0], broken], [0.5, 0.5])
