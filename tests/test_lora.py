"""LoRA and gradient checkpointing on the backbone (paper section 4.1): where gradients go."""

import pytest
import torch

from conftest import randomize_lora


def is_checkpointing(model) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


TEXTS = ["def add(a, b):\n    return a + b", "print('hello')", "x = [i * i for i in range(10)]"]


def embedding_loss(enc):
    batch = enc.tokenize(TEXTS, "document")
    emb = enc(**batch)
    return (emb @ emb.T).sum()


def test_gradients_reach_head_and_lora_only(make_encoder):
    enc = make_encoder(use_lora=True, lora_r=4, lora_alpha=8, pma_heads=4)
    randomize_lora(enc)  # with B = 0 (peft's init) A would get no gradient
    enc.train()
    embedding_loss(enc).backward()
    lora = {n: p for n, p in enc.backbone.named_parameters() if "lora_" in n}
    assert lora and all(p.requires_grad for p in lora.values())
    targets = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in lora}
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    for name, param in lora.items():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    for name, param in enc.pooler.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    frozen = [(n, p) for n, p in enc.backbone.named_parameters() if "lora_" not in n]
    assert frozen and all(not p.requires_grad and p.grad is None for _, p in frozen)


def test_gradient_checkpointing_gives_the_same_gradients(make_encoder):
    grads = []
    for checkpointing in (False, True):
        enc = make_encoder(use_lora=True, lora_r=4, pma_heads=4, gradient_checkpointing=checkpointing)
        randomize_lora(enc)
        enc.train()
        embedding_loss(enc).backward()
        assert is_checkpointing(enc.base_model) == checkpointing
        grads.append({n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_unknown_lora_target_is_named(make_encoder):
    with pytest.raises(ValueError, match="qkv_proj"):
        make_encoder(use_lora=True, lora_targets=["q_proj", "qkv_proj"])


def lora_output_dtypes(enc) -> set[torch.dtype]:
    """The dtypes the LoRA A matmuls compute in during one training forward and backward."""
    seen: set[torch.dtype] = set()
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
             for n, m in enc.backbone.named_modules() if n.endswith("lora_A.default")]  # fmt: skip
    embedding_loss(enc).backward()
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_lora_compute_backbone_runs_the_adapter_in_the_backbones_dtype(make_encoder, dtype):
    """`lora_compute: backbone` autocasts the LoRA matmuls to a 16-bit backbone's dtype, keeping float32 weights,
    gradients and optimizer state; with a float32 backbone, or by default, nothing changes."""
    torch_dtype = getattr(torch, dtype)
    runs = {}
    for compute in ("float32", "backbone"):
        enc = make_encoder(use_lora=True, lora_r=4, lora_alpha=8, pma_heads=4, dtype=dtype, lora_compute=compute)
        randomize_lora(enc)
        enc.train()
        runs[compute] = (enc, lora_output_dtypes(enc))
    assert runs["float32"][1] == {torch.float32}
    assert runs["backbone"][1] == {torch_dtype if dtype == "bfloat16" else torch.float32}
    enc = runs["backbone"][0]
    lora = {n: p for n, p in enc.backbone.named_parameters() if "lora_" in n}
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32 for p in lora.values())
    assert all(torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0 for p in lora.values())
    with torch.no_grad():  # the same weights: embeddings agree to bf16 arithmetic's precision
        a, b = (runs[c][0].eval()(**runs[c][0].tokenize(TEXTS, "document")) for c in ("float32", "backbone"))
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    assert (cosine >= 0.999).all(), cosine
    if dtype == "float32":
        torch.testing.assert_close(a, b)
