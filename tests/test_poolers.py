"""Baseline poolers: known answers and padding-side independence."""

import pytest
import torch

from c2llm_lib.model import LastTokenPooler, MeanPooler, PMAHead, build_pooler


def test_last_token_is_the_last_real_position_on_either_side():
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)
    left = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    torch.testing.assert_close(LastTokenPooler()(hidden, left), hidden[:, 3])
    torch.testing.assert_close(LastTokenPooler()(hidden, right), torch.stack([hidden[0, 1], hidden[1, 2]]))


def test_mean_over_real_tokens_known_answer():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(MeanPooler()(hidden, mask), torch.tensor([[2.0, 3.0]]))


def test_all_padding_rows_are_finite():
    hidden, mask = torch.zeros(1, 3, 4), torch.zeros(1, 3)
    assert torch.isfinite(MeanPooler()(hidden, mask)).all()
    assert torch.isfinite(LastTokenPooler()(hidden, mask)).all()


def test_build_pooler_choices_and_errors():
    assert isinstance(build_pooler("pma", 64, 32, 4), PMAHead)
    assert isinstance(build_pooler("mean", 64), MeanPooler)
    assert isinstance(build_pooler("last_token", 64), LastTokenPooler)
    with pytest.raises(ValueError, match="needs pooling='pma'"):
        build_pooler("mean", 64, 32)
    with pytest.raises(ValueError, match="unknown pooling"):
        build_pooler("cls", 64)


@pytest.mark.parametrize("pooler", [LastTokenPooler(), MeanPooler()], ids=["last_token", "mean"])
def test_a_mask_on_another_device_than_the_hidden_states_is_moved(pooler):
    # on a GPU the hidden states are on CUDA and a caller's mask may still be on the CPU (the encoding benchmark's
    # was); the meta device stands in for CUDA here: no data, but the same device check
    out = pooler(torch.zeros(2, 3, 4, device="meta"), torch.ones(2, 3, dtype=torch.long))
    assert out.device.type == "meta" and out.shape == (2, 4)
