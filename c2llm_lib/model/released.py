"""Reading the released codefuse-ai/C2LLM checkpoints (paper section 3) without their remote code. `KEY_RULES` is the
one table of released names (from CodeFuse-CGE and a port of the released file: fix it there if the release differs).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..files import load_json, load_tensors, refuse_pickle

# (released prefix, our prefix or None to drop); the first matching rule wins.
KEY_RULES: tuple[tuple[str, str | None], ...] = (
    ("plm_model.lm_head.", None),  # the LM head: never computed by an encoder
    ("lm_head.", None),
    ("plm_model.model.", "backbone."),  # plm_model is a *ForCausalLM wrapping the base model
    ("plm_model.", "backbone."),  # ... or the base model itself
    ("mha_pma.S", "pooler.seed"),  # the learned query, (1, 1, d)
    ("mha_pma.mab.", "pooler."),  # fc_q, fc_k, fc_v, fc_o, ln0, ln1
)
RELEASED_ONLY_CONFIG_KEYS = (
    "embedding_method",
    "pma_num_heads",
    "pma_ln",
    "pma_norm",
    "pma_norm_mode",
    "compressed_dim",
    "padding_side",
    "inf_seq_length",
    "keep_max_layer",
    "auto_map",
    "architectures",
    "model_type",
    "torch_dtype",
    "dtype",
    "attn_implementation",
    "_attn_implementation",
    "transformers_version",
    "_name_or_path",
)


class ReleasedCheckpointError(ValueError):
    """The directory is not a released C2LLM checkpoint we can read; the message says why."""


def rename_key(key: str) -> str | None:
    """Our name for a released weight name, None when the weight is deliberately dropped."""
    for old, new in KEY_RULES:
        if key.startswith(old):
            return None if new is None else new + key[len(old) :]
    raise KeyError(key)


def read_released_config(directory: Path) -> tuple[dict, dict]:
    """(pooler settings, backbone config dict) from a released `config.json`."""
    path = directory / "config.json"
    if not path.is_file():
        raise ReleasedCheckpointError(f"{path} does not exist: not a released C2LLM checkpoint directory")
    raw = load_json(path, "released config")
    method = raw.get("embedding_method", "pma")
    if method != "pma":
        raise ReleasedCheckpointError(f"{path}: embedding_method is {method!r}; only 'pma' checkpoints are read")
    if not raw.get("pma_ln", True):
        raise ReleasedCheckpointError(f"{path}: pma_ln is false; the released head uses post-LayerNorm")
    mode = raw.get("pma_norm_mode", "post_normal")
    if mode != "post_normal":
        raise ReleasedCheckpointError(f"{path}: pma_norm_mode {mode!r} is not the released 'post_normal'")
    missing = [k for k in ("pma_num_heads", "hidden_size") if k not in raw]
    if missing:
        raise ReleasedCheckpointError(f"{path}: missing config keys {missing}")
    pooler = {"pma_heads": raw["pma_num_heads"], "embedding_dim": raw.get("compressed_dim", raw["hidden_size"])}
    backbone = {k: v for k, v in raw.items() if k not in RELEASED_ONLY_CONFIG_KEYS}
    return pooler, backbone


def is_released_checkpoint(directory: str | Path) -> bool:
    """Whether `directory` is a released C2LLM checkpoint rather than a plain transformers backbone."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return False
    raw = load_json(path, "model config")
    return raw.get("model_type") == "c2llm" or "embedding_method" in raw


def read_released_weights(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint (single or sharded safetensors); a pickle `pytorch_model.bin` is refused."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = load_json(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ReleasedCheckpointError(f"{index}: no weight_map in the safetensors index")
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(load_tensors(directory / shard, "weights shard"))
        return tensors
    single = directory / "model.safetensors"
    if single.is_file():
        return load_tensors(single, "released weights")
    legacy = directory / "pytorch_model.bin"
    if legacy.is_file():
        refuse_pickle(legacy)
    raise ReleasedCheckpointError(f"{directory}: no model.safetensors or sharded safetensors index found")


def map_released_state_dict(
    tensors: dict[str, torch.Tensor], expected: set[str], head: bool = True
) -> dict[str, torch.Tensor]:
    """Released tensors under our names (no head's when `head` is False); raises listing unexpected and missing keys."""
    mapped, unexpected = {}, []
    for key, value in tensors.items():
        try:
            new = rename_key(key)
        except KeyError:
            unexpected.append(key)
            continue
        if new is None or (not head and new.startswith("pooler.")):
            continue
        if new not in expected:
            unexpected.append(f"{key} (as {new})")
        mapped[new] = value
    missing = sorted(expected - set(mapped))
    if unexpected or missing:
        raise ReleasedCheckpointError(
            "the checkpoint does not match the released C2LLM layout: "
            f"unexpected keys {sorted(unexpected)}; missing keys {missing}. "
            "If the release names its weights differently, fix KEY_RULES in c2llm_lib/model/released.py"
        )
    return mapped


def released_directory(source: str, revision: str | None = None) -> Path:
    """A local released checkpoint directory: `source` itself, or a hub snapshot of it (needs the hub)."""
    if Path(source).expanduser().is_dir():
        return Path(source).expanduser()
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(source, revision=revision))
    except Exception as err:
        raise ReleasedCheckpointError(
            f"{source!r} is not a local directory and could not be downloaded from the hub "
            f"(revision {revision}): {type(err).__name__}: {str(err)[:200]}"
        ) from err
