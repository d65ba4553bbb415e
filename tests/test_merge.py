"""Weighted checkpoint merge: [1, 0, 0, 0] is checkpoint 1, identical checkpoints merge to themselves,
merged weights are W_base + sum_i w_i Delta_i (not peft's averaged factors)."""

import numpy as np
import pytest
import torch

from c2llm_lib import C2LLMEncoder
from c2llm_lib.merge import check_weights, lora_deltas, merge_checkpoints
from c2llm_lib.train import encoder_from_checkpoint, save_checkpoint

from conftest import TINY_LORA, build_tiny, randomize_lora

TEXTS = ["def add(a, b):\n    return a + b", "SELECT 1;"]


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
