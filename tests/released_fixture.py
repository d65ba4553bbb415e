"""A checkpoint in the released codefuse-ai/C2LLM layout, written from a tiny encoder, for tests and rehearsals.

The layout (what `C2LLMEncoder.from_released` reads, model/released.py): `config.json` with `model_type: c2llm`
and the PMA fields, the backbone's weights under `plm_model.model.*` beside an unused `plm_model.lm_head.weight`,
the PMA head under `mha_pma.S` and `mha_pma.mab.*`, and the tokenizer files, all in one folder.

    python tests/released_fixture.py OUT_DIR    # writes a tiny release to OUT_DIR (e.g. for eval_released)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_released_checkpoint(enc, directory, extra=None, drop=None, shards=False) -> Path:
    """Our encoder's weights written in the released codefuse-ai layout (single file, or two shards and an index).
    `extra` adds tensors and `drop` removes keys, to test the loader's errors."""
    directory = Path(directory)
    directory.mkdir(parents=True)
    base = enc.base_model
    cfg = base.config.to_dict()
    cfg.update(
        architectures=["C2LLMForEmbedding"],
        auto_map={"AutoModel": "modeling_c2llm.C2LLMForEmbedding"},
        model_type="c2llm",
        embedding_method="pma",
        pma_num_heads=enc.pooler.num_heads,
        pma_ln=True,
        pma_norm=False,
        pma_norm_mode="post_normal",
        compressed_dim=enc.pooler.dim,
        padding_side="left",
    )
    (directory / "config.json").write_text(json.dumps(cfg))
    tensors = {f"plm_model.model.{k}": v.clone() for k, v in base.state_dict().items()}
    tensors["plm_model.lm_head.weight"] = base.state_dict()["embed_tokens.weight"].clone()
    tensors["mha_pma.S"] = enc.pooler.seed.detach().clone()
    for k, v in enc.pooler.state_dict().items():
        if k != "seed":
            tensors[f"mha_pma.mab.{k}"] = v.clone()
    tensors.update(extra or {})
    for key in drop or []:
        tensors.pop(key)
    if shards:
        keys = sorted(tensors)
        half = len(keys) // 2
        parts = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
        for name, ks in parts.items():
            save_file({k: tensors[k].contiguous() for k in ks}, directory / name)
        index = {"weight_map": {k: name for name, ks in parts.items() for k in ks}}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "model.safetensors")
    enc.tokenizer.save_pretrained(directory)
    return directory


def tiny_release(seed: int = 0, pma_heads: int = 4):
    """A tiny PMA encoder whose backbone is no longer the tiny random initialisation (every backbone weight is
    moved by seeded noise), so that a test can tell the release's backbone from a freshly built one."""
    from c2llm_lib import C2LLMEncoder, ModelConfig
    from c2llm_lib.model import TINY_BACKBONE

    torch.manual_seed(seed)
    enc = C2LLMEncoder.from_config(
        ModelConfig(backbone=TINY_BACKBONE, device="cpu", dtype="float32", pma_heads=pma_heads, use_lora=False)
    )
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in enc.base_model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.01)
    return enc


def write_tiny_release(directory, seed: int = 0, shards: bool = False) -> Path:
    """A tiny released-layout checkpoint in `directory` (which must not exist yet)."""
    return write_released_checkpoint(tiny_release(seed), directory, shards=shards)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/released_fixture.py OUT_DIR")
    print(write_tiny_release(Path(sys.argv[1])))
