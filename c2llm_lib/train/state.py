"""What a resumed training takes back (paper section 4.1): each rank's RNG state and the optimizer's, without pickle."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..files import CorruptFile


# RNG states: in memory as the libraries give them, on disk as JSON lists ------------------------------
def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rng_to_json(state: dict[str, Any]) -> dict[str, Any]:
    """`rng_state()` as plain lists and numbers (no pickle needed to store or read it)."""
    version, internal, gauss = state["python"]
    name, keys, pos, has_gauss, cached = state["numpy"]
    out = {"python": [version, list(internal), gauss], "numpy": [name, keys.tolist(), int(pos), int(has_gauss),
           float(cached)], "torch": state["torch"].tolist()}  # fmt: skip
    if "cuda" in state:
        out["cuda"] = [s.tolist() for s in state["cuda"]]
    return out


def rng_from_json(value: Any, source: str | Path) -> dict[str, Any]:
    """The inverse of `rng_to_json`; a malformed state is an error naming `source`."""
    try:
        version, internal, gauss = value["python"]
        name, keys, pos, has_gauss, cached = value["numpy"]
        state = {
            "python": (int(version), tuple(int(x) for x in internal), gauss),
            "numpy": (str(name), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)),
            "torch": torch.tensor(value["torch"], dtype=torch.uint8),
        }
        if "cuda" in value:
            state["cuda"] = [torch.tensor(s, dtype=torch.uint8) for s in value["cuda"]]
    except (KeyError, TypeError, ValueError) as err:
        raise CorruptFile(f"{source}: the saved RNG state is malformed ({type(err).__name__}: {err})") from None
    return state


# checkpoints on disk ----------------------------------------------------------------------------------
def optimizer_to_state(state_dict: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """An optimizer state_dict as (JSON part, tensors): tensors keyed `optimizer.<param id>.<name>`."""
    tensors, scalars = {}, {}
    for pid, values in state_dict["state"].items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{pid}.{name}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(pid), {})[name] = value
    return {"param_groups": state_dict["param_groups"], "scalars": scalars}, tensors


def optimizer_from_state(value: dict[str, Any], tensors: dict[str, torch.Tensor], source: str | Path) -> dict:
    """The inverse of `optimizer_to_state` (param ids back to ints, as `load_state_dict` matches them)."""
    try:
        state: dict[int, dict[str, Any]] = {}
        for key, tensor in tensors.items():
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = tensor
        for pid, values in value["scalars"].items():
            state.setdefault(int(pid), {}).update(values)
        return {"state": state, "param_groups": value["param_groups"]}
    except (KeyError, TypeError, ValueError) as err:
        raise CorruptFile(f"{source}: the saved optimizer state is malformed ({type(err).__name__}: {err})") from None


TrainerState = tuple[dict[str, Any], dict[str, torch.Tensor]]  # (the JSON part, the optimizer's tensors)
