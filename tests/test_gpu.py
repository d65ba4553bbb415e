"""GPU paths (bf16, flash-attention 2): skipped cleanly on machines without CUDA."""

import numpy as np
import pytest
import torch

from c2llm_lib import C2LLMEncoder, ModelConfig
from c2llm_lib.model import TINY_BACKBONE
from c2llm_lib.model.backbone import flash_attention_available

from conftest import requires_cuda

TEXTS = ["def add(a, b):\n    return a + b", "x = 1", "SELECT name FROM users;"]


@requires_cuda
def test_bf16_on_cuda_matches_float32_on_cpu():
    torch.manual_seed(0)
    gpu = C2LLMEncoder.from_config(ModelConfig(backbone=TINY_BACKBONE, device="cuda", pma_heads=4, use_lora=False))
    assert next(gpu.base_model.parameters()).dtype == torch.bfloat16  # dtype "auto" on CUDA
    assert gpu.pooler.fc_q.weight.dtype == torch.float32  # the head stays in fp32
    torch.manual_seed(0)
    cpu = C2LLMEncoder.from_config(ModelConfig(backbone=TINY_BACKBONE, device="cpu", dtype="float32", pma_heads=4,
                                                 use_lora=False))  # fmt: skip
    a, b = gpu.encode(TEXTS), cpu.encode(TEXTS)
    assert np.isfinite(a).all() and (a * b).sum(1).min() > 0.99  # cosine of bf16 vs fp32 embeddings


@requires_cuda
@pytest.mark.skipif(not flash_attention_available(), reason="flash-attn is not installed")
def test_flash_attention_matches_sdpa_with_left_padding():
    cfg = dict(backbone=TINY_BACKBONE, device="cuda", dtype="bfloat16", pma_heads=4, use_lora=False)
    torch.manual_seed(0)
    flash = C2LLMEncoder.from_config(ModelConfig(**cfg, attn_implementation="flash_attention_2"))
    torch.manual_seed(0)
    sdpa = C2LLMEncoder.from_config(ModelConfig(**cfg, attn_implementation="sdpa"))
    assert (flash.encode(TEXTS) * sdpa.encode(TEXTS)).sum(1).min() > 0.99


def test_flash_attention_is_refused_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU-only refusal")
    with pytest.raises(RuntimeError, match="needs CUDA"):
        C2LLMEncoder.from_config(
            ModelConfig(backbone=TINY_BACKBONE, attn_implementation="flash_attention_2", use_lora=False)
        )


def tiny_cuda(**overrides) -> C2LLMEncoder:
    values = dict(backbone=TINY_BACKBONE, device="cuda", dtype="bfloat16", pma_heads=4, use_lora=True, lora_r=4,
                  lora_alpha=8, max_length=32)  # fmt: skip
    torch.manual_seed(0)
    return C2LLMEncoder.from_config(ModelConfig(**{**values, **overrides}))


@requires_cuda
@pytest.mark.parametrize("grad_cache", [False, True], ids=["plain", "grad-cache"])
def test_a_bf16_training_step_on_cuda_trains_lora_and_head(grad_cache):
    from c2llm_lib.config import TrainConfig
    from tools.preflight.probe import largest_batch, trainer_for

    enc = tiny_cuda(gradient_checkpointing=True)  # the recipes' settings: checkpointing, LoRA, PMA, bf16
    step = trainer_for(enc, TrainConfig(max_length=32, global_batch_size=4, num_negatives=2, grad_cache=grad_cache,
                                        grad_cache_chunk=2), 2)  # fmt: skip
    before = {n: p.detach().clone() for n, p in enc.named_parameters() if p.requires_grad}
    logged = step.take_step(largest_batch(enc.tokenizer, 2, 2, 32, 0))
    assert np.isfinite(logged["loss"]) and logged["tokens"] > 0
    moved = {n for n, p in enc.named_parameters() if p.requires_grad and not torch.equal(p, before[n])}
    assert any("lora_B" in n for n in moved) and any("pooler" in n for n in moved)
    assert torch.cuda.max_memory_allocated() > 0


@requires_cuda
def test_sdpa_matches_eager_attention_on_cuda_with_left_padding():
    sdpa = tiny_cuda(attn_implementation="sdpa", use_lora=False)
    eager = tiny_cuda(attn_implementation="eager", use_lora=False)
    texts = [*TEXTS, "a much longer text " * 6]  # left padding on the short ones
    assert (sdpa.encode(texts) * eager.encode(texts)).sum(1).min() > 0.99


@requires_cuda
def test_one_nccl_process_gathers_with_gradients():
    import socket

    import torch.distributed as dist

    from c2llm_lib import distributed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        x = torch.randn(4, 3, device="cuda", requires_grad=True)
        gathered = distributed._GATHER(x)  # what training gathers with more than one process
        gathered.sum().backward()
        total = torch.ones(1, device="cuda")
        dist.all_reduce(total)
        assert torch.equal(gathered, x) and torch.equal(x.grad, torch.ones_like(x)) and total.item() == 1
    finally:
        dist.barrier()
        dist.destroy_process_group()


@requires_cuda
def test_the_flop_counter_counts_cuda_attention_as_the_rule_without_the_causal_half():
    # torch's counter has formulas for the CUDA attention kernels (not for the CPU's: tests/test_flops.py uses eager);
    # it counts all T x T pairs, which the rule's causal=False gives
    from test_flops import StepFlops  # torch's formulas without FlopCounterMode's module tracker (its hooks fail here)
    from transformers import AutoModel

    from c2llm_lib.model.backbone import add_lora, load_tokenizer, tiny_qwen2_config
    from tools.scale import arch_of, text_flops

    # as many key/value heads as query heads: transformers passes grouped heads to SDPA (enable_gqa), which torch
    # 2.11's counter refuses ("query/key/value shapes are incompatible"); the rule's GQA is tests/test_flops.py's
    cfg = ModelConfig(backbone=TINY_BACKBONE, device="cuda", dtype="bfloat16", pma_heads=4, use_lora=True, lora_r=4,
                      lora_alpha=8, max_length=32, attn_implementation="sdpa")  # fmt: skip
    torch.manual_seed(0)
    backbone = AutoModel.from_config(tiny_qwen2_config(num_key_value_heads=4), attn_implementation="sdpa",
                                     dtype=torch.bfloat16).to("cuda")  # fmt: skip
    enc = C2LLMEncoder(add_lora(backbone, cfg), load_tokenizer(cfg), cfg)
    ids = torch.randint(100, 1000, (3, 16), device="cuda")
    with torch.no_grad(), StepFlops() as counter:
        enc(input_ids=ids, attention_mask=torch.ones_like(ids))
    arch = arch_of(enc.backbone_config)
    rule = 3 * text_flops(arch, 16, lora_r=4, head_width=64, causal=False)["forward"] + 2 * 64 * 64  # + fc_q once
    assert counter.total == rule
