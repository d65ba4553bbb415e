"""The FLOP rule of `tools/scale.py` (the plan's hours, the preflight's MFU) against known answers: hand-computed
counts, and torch's `FlopCounterMode` on the tiny Qwen2 with LoRA and the PMA head.

The counter counts matrix products (mm, addmm, bmm, and attention kernels it has a formula for), as the rule does.
The model runs with eager attention: torch 2.13's counter has no formula for the CPU's fused attention kernel
(`_scaled_dot_product_flash_attention_for_cpu`), and the eager path computes the same two products as explicit
matmuls, over all T x T pairs (the rule's `causal=False`; a causal kernel skips the masked half, which the rule's
default counts). Every comparison below is exact, each difference from the rule named and sized:

- fc_q of the PMA head runs once per forward call (the seed is shared by the micro-batch): 2 d^2, plus 4 d^2 in the
  backward (the seed trains);
- torch's non-reentrant checkpoint stops its recomputation once backward has what it needs: each layer's last
  product, down_proj's LoRA B (2 r h per token per layer), is not recomputed;
- without checkpointing the first layer's q, k, v take the frozen embedding's output, which needs no gradient: their
  input gradients (base and LoRA A) are not computed.
"""

import pytest
import torch
import torch.utils.checkpoint as checkpoint
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from c2llm_lib.config import TrainConfig
from tools.preflight.probe import largest_batch, trainer_for
from tools.scale import (
    QWEN25_CODER_05B,
    QWEN25_CODER_7B,
    Arch,
    arch_of,
    forward_flops_per_token,
    lora_params,
    matmul_params,
    step_flops,
    text_flops,
)

from conftest import build_tiny

TINY = Arch("tiny", 64, 2, 4, 2, 128, 151936, True)  # tiny_qwen2_config: hidden 64, 2 layers, 4 heads, 2 KV heads
R, B, T = 4, 3, 16  # LoRA rank, texts, tokens per text


def counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


class StepFlops(TorchDispatchMode):
    """`FlopCounterMode`'s own formulas (`flop_registry`) without its module tracker, whose gradient hooks fail on
    GradCache's graph-free first pass (a hook on the PMA seed's view under no_grad)."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **(kwargs or {}), out_val=out)
        return out


def tiny_encoder(**overrides):
    values = {"use_lora": True, "lora_r": R, "lora_alpha": 8, "pma_heads": 4, "attn_implementation": "eager"}
    enc = build_tiny(**{**values, **overrides})
    enc.train()
    return enc


def tokens(seed: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.randint(100, 1000, (B, T), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones(B, T, dtype=torch.long)}  # no padding: T tokens each


def test_hand_computed_counts():
    # one layer's matrices: q 64x64, k and v 64x32, o 64x64, gate and up 64x128, down 128x64
    assert matmul_params(TINY) == 2 * (4096 + 2 * 2048 + 4096 + 3 * 8192) == 73_728
    assert lora_params(TINY, R) == 2 * R * (2 * 128 + 2 * 96 + 3 * 192) == 8_192
    parts = text_flops(TINY, T, lora_r=R, head_width=64)
    assert parts["matmuls"] == 2 * 73_728 * T and parts["lora"] == 2 * 8_192 * T
    # causal: token i meets i keys, 16 * 17 / 2 = 136 pairs; QK^T and AV 2 * 64 FLOPs per pair each, 2 layers
    assert parts["attention"] == 2 * 2 * 2 * 64 * 136 == text_flops(TINY, T, causal=False)["attention"] * 136 / 256
    assert parts["head"] == 4 * 64 * 64 * T + 4 * 64 * T + 2 * 64 * 64
    plain = text_flops(TINY, T, lora_r=R, head_width=64)
    assert plain["backward"] == parts["matmuls"] + 2 * (parts["lora"] + parts["attention"] + parts["head"])
    both = text_flops(TINY, T, True, True, lora_r=R, head_width=64)
    decoder = parts["matmuls"] + parts["lora"] + parts["attention"]
    assert both["total"] == 2 * plain["forward"] + plain["backward"] + decoder
    full = text_flops(TINY, T, lora_r=0, head_width=0, full_finetune=True)
    assert full["backward"] == 2 * full["matmuls"] + 2 * full["attention"]
    assert forward_flops_per_token(TINY, 0) == 2 * 73_728  # no attention at no length (the preflight's share)


def test_forward_equals_the_counter():
    enc = tiny_encoder()
    assert arch_of(enc.backbone_config, "tiny") == TINY
    found = counted(lambda: enc(**tokens()))
    rule = B * text_flops(TINY, T, lora_r=R, head_width=64, causal=False)["forward"]
    assert found == rule + 2 * 64 * 64  # + fc_q once per call


@pytest.mark.parametrize("early_stop", [False, True], ids=["full-recompute", "torch-default"])
def test_backward_with_checkpointing_equals_the_counter(early_stop):
    enc = tiny_encoder(gradient_checkpointing=True)
    with checkpoint.set_checkpoint_early_stop(early_stop):
        emb = enc(**tokens())
        found = counted(lambda: emb.sum().backward())
    rule = text_flops(TINY, T, gradient_checkpointing=True, lora_r=R, head_width=64, causal=False)
    expected = B * (rule["backward"] + rule["recompute"]) + 4 * 64 * 64  # + fc_q's backward
    if early_stop:  # each layer's down_proj LoRA B is not recomputed
        expected -= TINY.layers * 2 * R * TINY.hidden * B * T
    assert found == expected


def test_backward_without_checkpointing_equals_the_counter():
    enc = tiny_encoder()
    emb = enc(**tokens())
    found = counted(lambda: emb.sum().backward())
    rule = text_flops(TINY, T, lora_r=R, head_width=64, causal=False)
    kv = TINY.kv_heads * TINY.head_dim
    first_layer = 2 * TINY.hidden * (TINY.hidden + 2 * kv) + 3 * 2 * R * TINY.hidden  # q, k, v: base and LoRA A
    assert found == B * (rule["backward"] - first_layer * T) + 4 * 64 * 64


def test_a_whole_backbone_trains_with_weight_gradients():
    enc = tiny_encoder(use_lora=False, pooling="last_token")
    emb = enc(**tokens())
    found = counted(lambda: emb.sum().backward())
    rule = text_flops(TINY, T, lora_r=0, head_width=0, full_finetune=True, causal=False)
    assert found == B * rule["backward"]  # the embedding trains: every input gradient is computed


def test_grad_cache_adds_one_forward_of_every_text():
    cfg = TrainConfig(max_length=T, global_batch_size=4, num_negatives=1, grad_cache_chunk=2)
    enc = tiny_encoder(max_length=T)
    batch = largest_batch(enc.tokenizer, rows=2, negatives=1, length=T, seed=0)  # 6 texts, each cut to T tokens
    flops = {}
    for grad_cache in (False, True):
        step = trainer_for(enc, TrainConfig(**{**cfg.to_dict(), "grad_cache": grad_cache}), 1)
        with StepFlops() as counter:
            step.take_step(batch)
        flops[grad_cache] = counter.total
    texts, micro_batches = 6, 3  # queries (2) and documents (4) apart, 2 texts per micro-batch
    first_pass = texts * text_flops(TINY, T, lora_r=R, head_width=64, causal=False)["forward"]
    assert flops[True] - flops[False] == first_pass + micro_batches * 2 * 64 * 64


def test_the_recipes_count_lora_and_attention_backward():
    # the old count: (2 + checkpointing + GradCache) forwards of 2 M + 2 L h T per token, no LoRA
    for arch, grad_cache, more in ((QWEN25_CODER_05B, False, 0.147), (QWEN25_CODER_7B, True, 0.038)):
        passes = 3 + grad_cache
        old = passes * (2 * matmul_params(arch) + 2 * arch.layers * arch.hidden * 1024) * 1024
        new = step_flops(arch, 1, 1024, True, grad_cache)
        assert new / old - 1 == pytest.approx(more, abs=0.002)
    assert lora_params(QWEN25_CODER_05B) / matmul_params(QWEN25_CODER_05B) == pytest.approx(0.098, abs=0.001)
