"""Ad-hoc CUDA diagnosis of the bf16-vs-CPU mismatch and the NaN at step 1 (not part of the repository)."""

import contextlib
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F

from c2llm_lib import C2LLMEncoder, ModelConfig
from c2llm_lib.model import TINY_BACKBONE

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
TEXTS = ["def add(a, b):\n    return a + b", "x = 1", "SELECT name FROM users;", "a much longer text " * 6]
T0 = time.time()


def build(device, dtype, attn="sdpa", lora=False, **kw):
    torch.manual_seed(0)
    return C2LLMEncoder.from_config(
        ModelConfig(
            backbone=TINY_BACKBONE,
            device=device,
            dtype=dtype,
            pma_heads=4,
            use_lora=lora,
            attn_implementation=attn,
            **kw,
        )
    )


def section(name):
    print(f"\n=== {name} ({time.time() - T0:.0f}s)", flush=True)


def sdpa_ctx(backend):
    if backend is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, backend)])


section("A: embeddings and hidden states against CPU float32")
try:
    ref = build("cpu", "float32")
    batch = ref.tokenize(TEXTS)
    with torch.no_grad():
        ref_layers = ref.backbone(
            **batch, position_ids=(batch["attention_mask"].cumsum(-1) - 1).clamp(min=0), output_hidden_states=True
        ).hidden_states
    e_ref = ref.encode(TEXTS)
    alone_ref = np.concatenate([ref.encode([t]) for t in TEXTS])
    print("cpu fp32 batched vs alone cos", (e_ref * alone_ref).sum(1).round(5))
    sd_ref = {k: v.float() for k, v in ref.state_dict().items()}
    for dev, dt, attn, backend in [
        (DEV, "bfloat16", "sdpa", None),
        (DEV, "float32", "sdpa", None),
        (DEV, "float32", "eager", None),
        (DEV, "bfloat16", "eager", None),
        (DEV, "bfloat16", "sdpa", "MATH"),
        (DEV, "bfloat16", "sdpa", "EFFICIENT_ATTENTION"),
        (DEV, "bfloat16", "sdpa", "CUDNN_ATTENTION"),
        ("cpu", "bfloat16", "sdpa", None),
    ]:
        try:
            with sdpa_ctx(backend if dev == "cuda" else None):
                m = build(dev, dt, attn)
                sd = m.state_dict()
                worst = max(((sd[k].float().cpu() - v).abs().max().item(), k) for k, v in sd_ref.items())
                b = {k: v.to(m.device) for k, v in batch.items()}
                with torch.no_grad():
                    layers = m.backbone(
                        **b, position_ids=(b["attention_mask"].cumsum(-1) - 1).clamp(min=0), output_hidden_states=True
                    ).hidden_states
                keep = batch["attention_mask"].bool()
                lay = [
                    F.cosine_similarity(h.float().cpu()[keep], r[keep], dim=-1).min().item()
                    for h, r in zip(layers, ref_layers, strict=True)
                ]
                e = m.encode(TEXTS)
                alone = np.concatenate([m.encode([t]) for t in TEXTS])
                print(
                    f"{dev} {dt} {attn} {backend}: worst param diff {worst[0]:.2e} ({worst[1]}); per-layer min cos "
                    f"(real tokens) {np.round(lay, 4).tolist()}; "
                    f"emb cos vs ref {np.round((e * e_ref).sum(1), 4).tolist()}; "
                    f"alone vs ref {np.round((alone * alone_ref).sum(1), 4).tolist()}; finite {np.isfinite(e).all()}",
                    flush=True,
                )
        except Exception as err:
            print(f"{dev} {dt} {attn} {backend}: ERROR {type(err).__name__}: {err}"[:600], flush=True)
except Exception:
    traceback.print_exc()

section("B: one training step (LoRA, PMA, checkpointing) with padding: finite?")
try:
    from c2llm_lib.config import TrainConfig
    from tools.preflight.probe import trainer_for  # c2llm_lib.preflight.probe when this ran (docs/layout.md)

    rows = 4
    words = ["alpha", "beta", "gamma", "delta", "def f(x): return x", "SELECT 1", "import os"]
    rng = np.random.default_rng(0)

    def text(n):
        return " ".join(rng.choice(words, n))

    batch = {
        "dataset": ["CodeSearchNetCCRetrieval"] * rows,
        "language": ["python"] * rows,
        "instruction": ["Given a code snippet, retrieve its completion"] * rows,
        "query": [text(n) for n in (2, 5, 9, 14)],
        "positive": [text(n) for n in (3, 11, 6, 20)],
        "negatives": [[text(n) for n in (4, 13)] for _ in range(rows)],
    }
    for dt, attn, backend, ckpt, lc in [
        ("bfloat16", "sdpa", None, True, "float32"),
        ("bfloat16", "sdpa", None, True, "backbone"),
        ("bfloat16", "sdpa", None, False, "float32"),
        ("bfloat16", "eager", None, True, "float32"),
        ("float32", "sdpa", None, True, "float32"),
        ("float32", "eager", None, True, "float32"),
        ("bfloat16", "sdpa", "MATH", True, "float32"),
        ("bfloat16", "sdpa", "EFFICIENT_ATTENTION", True, "float32"),
        ("bfloat16", "sdpa", "CUDNN_ATTENTION", True, "float32"),
        ("float32", "sdpa", "EFFICIENT_ATTENTION", True, "float32"),
    ]:
        name = f"{dt} {attn} {backend} ckpt={ckpt} lora_compute={lc}"
        try:
            with sdpa_ctx(backend if CUDA else None):
                enc = build(
                    DEV,
                    dt,
                    attn,
                    lora=True,
                    lora_r=4,
                    lora_alpha=8,
                    max_length=64,
                    gradient_checkpointing=ckpt,
                    lora_compute=lc,
                )
                step = trainer_for(
                    enc, TrainConfig(max_length=64, global_batch_size=4, num_negatives=2, max_steps=20), 2
                )
                step.optimizer.zero_grad(set_to_none=True)
                out = step.forward_backward(batch)
                bad_grads = [n for n, p in step.trained if p.grad is not None and not torch.isfinite(p.grad).all()]
                none_grads = [n for n, p in step.trained if p.grad is None]
                # hidden states of the same texts, checking for non-finite values in the forward
                texts, _ = step.texts(batch)
                toks = enc.tokenize_formatted(texts, 64)
                with torch.no_grad():
                    h = enc.hidden_states(toks["input_ids"], toks["attention_mask"])
                    raw = enc.backbone(
                        input_ids=toks["input_ids"].to(enc.device),
                        attention_mask=toks["attention_mask"].to(enc.device),
                        position_ids=(toks["attention_mask"].cumsum(-1) - 1).clamp(min=0).to(enc.device),
                    ).last_hidden_state
                pad_rows_nonfinite = (
                    (~torch.isfinite(raw.float())).any(-1)[~toks["attention_mask"].bool().to(enc.device)].sum().item()
                )
                print(
                    f"{name}: loss {out['loss'].item():.4f}; grads non-finite {len(bad_grads)} of {len(step.trained)} "
                    f"(e.g. {bad_grads[:2]}); no grad {len(none_grads)}; "
                    f"hidden finite {torch.isfinite(h).all().item()}; "
                    f"non-finite raw hidden at padded positions {pad_rows_nonfinite}",
                    flush=True,
                )
        except Exception as err:
            print(f"{name}: ERROR {type(err).__name__}: {err}"[:600], flush=True)
except Exception:
    traceback.print_exc()
print(f"\ndone in {time.time() - T0:.0f}s; torch {torch.__version__}")
