"""Reading the files a run or a model directory holds, with errors that name the file and what is wrong.

Weights are read from safetensors only: a safetensors file holds tensors and nothing that runs, while a
PyTorch `.bin` or `.pt` file is a pickle that can execute code when it is loaded. JSON records (configs,
trainer state) are read with a message naming the file when they are missing, truncated or not an object.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


class CorruptFile(ValueError):
    """A file that exists but cannot be read as what it should be; the message names it and the reason."""


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def refuse_pickle(path: str | Path) -> None:
    """Raises for a pickle-based weights file: loading one can run arbitrary code."""
    path = Path(path)
    if path.suffix in PICKLE_SUFFIXES:
        raise CorruptFile(
            f"{path}: refusing to load a pickle-based weights file ({path.suffix}); pickles can run code when "
            "loaded. Convert it to safetensors (safetensors.torch.save_file) and load that instead"
        )


def load_tensors(path: str | Path, what: str = "weights") -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file; a missing, truncated or corrupt file is named with the reason."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    refuse_pickle(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the {what} file is missing")
    if path.stat().st_size < 8:
        raise CorruptFile(f"{path}: the {what} file is truncated ({path.stat().st_size} bytes, no safetensors header)")
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CorruptFile(f"{path}: the {what} file is corrupt or truncated ({err})") from None


def load_json(path: str | Path, what: str = "record") -> dict[str, Any]:
    """A JSON object from a file; a missing file, bad JSON or a non-object is named with the reason."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the {what} file is missing")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptFile(f"{path}: the {what} file is not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise CorruptFile(f"{path}: the {what} file must hold a JSON object, got {type(value).__name__}")
    return value
