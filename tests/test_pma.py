"""PMA head (paper eq. 1-6) against a literal transcription of the released head, and its invariances."""

import pytest
import torch

from c2llm_lib.model import PMAHead

from reference_pma import reference_of

SHAPES = [  # (B, T, d_LLM, d, heads)
    (3, 7, 64, 64, 4),
    (2, 11, 48, 32, 8),
    (4, 5, 96, 96, 32),
    (1, 1, 16, 16, 1),
]


def random_mask(B, T, gen):
    """Mixed left and right padding, every row with at least one real token."""
    mask = torch.zeros(B, T)
    for i in range(B):
        n = int(torch.randint(1, T + 1, (1,), generator=gen))
        if i % 2:
            mask[i, T - n :] = 1
        else:
            mask[i, :n] = 1
    return mask


def perturb(head: PMAHead, gen) -> None:
    """Random LayerNorm affine values, so that the test covers them too (they start at 1 and 0)."""
    with torch.no_grad():
        for ln in (head.ln0, head.ln1):
            ln.weight.copy_(1 + 0.3 * torch.randn(ln.weight.shape, generator=gen))
            ln.bias.copy_(0.3 * torch.randn(ln.bias.shape, generator=gen))


@pytest.mark.parametrize("B,T,d_llm,d,heads", SHAPES)
def test_matches_the_released_head(B, T, d_llm, d, heads):
    gen = torch.Generator().manual_seed(B * 1000 + T)
    torch.manual_seed(T)
    head = PMAHead(d_llm, d, heads)
    perturb(head, gen)
    X = torch.randn(B, T, d_llm, generator=gen) * 3
    mask = random_mask(B, T, gen)
    ours = head(X, mask)
    assert ours.shape == (B, d)
    torch.testing.assert_close(ours, reference_of(head, X, mask), rtol=1e-5, atol=1e-5)


def test_per_head_scale_is_the_ablation_option():
    gen = torch.Generator().manual_seed(0)
    head = PMAHead(32, 32, 4, score_scale="per_head")
    X, mask = torch.randn(2, 6, 32, generator=gen) * 4, random_mask(2, 6, gen)
    torch.testing.assert_close(head(X, mask), reference_of(head, X, mask, scale_width=8), rtol=1e-5, atol=1e-5)
    full = PMAHead(32, 32, 4)
    full.load_state_dict(head.state_dict())
    assert not torch.allclose(full(X, mask), head(X, mask), atol=1e-4)


def test_parameter_count_matches_the_released_0_5b():
    # mteb registers C2LLM-0.5B with 497,252,096 parameters; the backbone has 494,032,768.
    head = PMAHead(896, None, 32)
    assert sum(p.numel() for p in head.parameters()) == 497_252_096 - 494_032_768
    assert head.seed.shape == (1, 1, 896) and head.fc_q.bias is not None and head.fc_k.bias is not None


def test_flexible_dimension_projects_keys_and_values_to_d():
    head = PMAHead(96, 32, 8)
    assert head.fc_k.weight.shape == (32, 96) and head.fc_v.weight.shape == (32, 96)
    assert head(torch.randn(2, 4, 96), torch.ones(2, 4)).shape == (2, 32)


def test_invariant_to_the_order_of_real_tokens():
    gen = torch.Generator().manual_seed(3)
    head = PMAHead(32, 32, 4)
    X = torch.randn(2, 9, 32, generator=gen)
    mask = random_mask(2, 9, gen)
    perm = torch.randperm(9, generator=gen)
    torch.testing.assert_close(head(X[:, perm], mask[:, perm]), head(X, mask), rtol=1e-5, atol=1e-6)


def test_padded_positions_do_not_matter():
    gen = torch.Generator().manual_seed(4)
    head = PMAHead(32, 32, 4)
    X = torch.randn(3, 8, 32, generator=gen)
    mask = random_mask(3, 8, gen)
    noisy = torch.where(mask.bool()[..., None], X, torch.randn(X.shape, generator=gen) * 1e4)
    torch.testing.assert_close(head(noisy, mask), head(X, mask))


def test_attention_weights_shape_and_mass():
    gen = torch.Generator().manual_seed(5)
    head = PMAHead(32, 32, 4)
    X, mask = torch.randn(3, 6, 32, generator=gen), random_mask(3, 6, gen)
    emb, attn = head(X, mask, return_attention=True)
    assert attn.shape == (3, 4, 6)
    torch.testing.assert_close(attn.sum(-1), torch.ones(3, 4))
    assert torch.all(attn[~mask.bool()[:, None, :].expand_as(attn)] == 0)
    torch.testing.assert_close(emb, head(X, mask))


def test_all_padding_row_is_finite_and_depends_on_the_seed_only():
    head = PMAHead(32, 32, 4)
    mask = torch.tensor([[0.0] * 5, [1.0] * 5])
    a = head(torch.randn(2, 5, 32), mask)
    b = head(torch.randn(2, 5, 32) * 100, mask)
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a[0], b[0])
    expected = head.ln1(  # O = 0 when nothing is attended: E = LN1(LN0(q) + ReLU(fc_o(LN0(q))))
        head.ln0(head.fc_q(head.seed[0])) + torch.relu(head.fc_o(head.ln0(head.fc_q(head.seed[0]))))
    )[0]
    torch.testing.assert_close(a[0], expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_compute_in_float32(dtype):
    gen = torch.Generator().manual_seed(6)
    head = PMAHead(32, 32, 4)
    X = (torch.randn(2, 7, 32, generator=gen) * 50).to(dtype)  # large scores: -1e12 would overflow fp16
    mask = random_mask(2, 7, gen)
    out = head(X, mask)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out, head(X.float(), mask))


def test_gradients_reach_the_seed_and_every_projection():
    head = PMAHead(32, 16, 4)
    X, mask = torch.randn(3, 5, 32), torch.ones(3, 5)
    head(X, mask).pow(2).sum().backward()
    for name, param in head.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="divisible"):
        PMAHead(64, 30, 4)
    with pytest.raises(ValueError, match="score_scale"):
        PMAHead(64, 64, 4, score_scale="sqrt")
