"""Parameter checking: `ConfigError`, `require`, the type check of a dataclass's fields against their annotations
(every float finite), and the did-you-mean for unknown keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Literal


class ConfigError(ValueError):
    """A parameter that does not exist, or has the wrong type or value; the message names it."""


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin is list:
        (item,) = typing.get_args(annotation) or (Any,)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict:
        key_type, item = typing.get_args(annotation) or (Any, Any)
        return isinstance(value, dict) and all(_matches(k, key_type) and _matches(v, item) for k, v in value.items())
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _describe(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in typing.get_args(annotation))
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and origin is None:
        return annotation.__name__
    return str(annotation).replace("typing.", "")


# keys no notebook declares any more, each with what replaced it (said where a params file still sets one)
MOVED_KEYS = {
    "ablations": "notebook 04's quick pooling ablation gave way to notebook 06's pooling study: set "
    "compare_poolings: [pma, last_token, mean] (docs/studies.md)",
    "ablation_dims": "notebook 06's pooling study truncates to compare_dims and trains PMA at compare_pma_dims",
}


def unknown_keys(unknown: list[str], known: set[str]) -> str:
    """'key' (did you mean 'closest'?), ... for each unknown key; a key of `MOVED_KEYS` with its replacement."""
    hints = []
    for key in unknown:
        close = [f" (did you mean {c!r}?)" for c in difflib.get_close_matches(key, known, n=1)]
        hints.append(f"{key!r}" + (f" (moved: {MOVED_KEYS[key]})" if key in MOVED_KEYS else "".join(close)))
    return ", ".join(hints)


def _not_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_not_finite(v) for v in value.values())
    return isinstance(value, list) and any(_not_finite(v) for v in value)


def check_types(obj: Any) -> None:
    """Checks every field of a dataclass instance against its annotation, and that every float is finite."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not _matches(value, hints[f.name]):
            raise ConfigError(
                f"parameter {f.name!r} must be {_describe(hints[f.name])}, got {value!r} ({type(value).__name__})"
            )
        if _not_finite(value):
            raise ConfigError(f"parameter {f.name!r} must be finite, got {value!r}")


def require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"parameter {key!r} {message}")
