"""Params resolution: a params file, an overlay and `--set` values, resolved against every notebook's `parameters`
cell and validated by the stage dataclasses. `resolve_run` is the one call; the rules are written once in
docs/runner.md.
"""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from .checks import ConfigError, unknown_keys
from .config import from_dict
from .notebook import NOTEBOOK_DIR, ON_REQUEST, RUN_KEYS, STAGES, read_parameters, stage_keys
from .runs import check_run_name

NOTEBOOKS = list(STAGES)


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(f"the key {key!r} is given twice (lines {first} and {second}); keep one")


class ParamsLoader(yaml.SafeLoader):
    """YAML for params: refuses a key given twice in one mapping, and reads `1e-3`, `5E4` or `1.0e5` as floats (YAML
    1.1 reads them as strings)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str) and key in seen:
                raise _DuplicateKey(key, seen[key], line)
            if isinstance(key, str):
                seen[key] = line
        return super().construct_mapping(node, deep)


ParamsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def read_yaml(text: str) -> Any:
    return yaml.load(text, Loader=ParamsLoader)  # noqa: S506 (a SafeLoader)


def load_params(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such params file")
    try:
        data = read_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        line = err.object[: err.start].count(b"\n") + 1
        raise ConfigError(f"{path}: is not UTF-8 text (byte {err.object[err.start]:#04x} on line {line}); save the "
                          "params file as UTF-8") from None  # fmt: skip
    except _DuplicateKey as err:
        raise ConfigError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: does not parse as YAML: {err}") from None
    if data is None or data == {}:
        raise ConfigError(
            f"{path}: holds no parameters; a params file lists the overrides of a run (params/smoke.yaml is the "
            "tiny one). To run every notebook default, say so with one key, e.g. `seed: 0`"
        )
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigError(f"{path}: must be a flat mapping of parameter names to values")
    return data


def _takes_a_list(key: str) -> bool:
    """Whether a stage dataclass declares `key` as a list (or an optional list)."""
    for cls in (c for classes in STAGES.values() for c in classes):
        hint = typing.get_type_hints(cls).get(key)
        if hint is not None:
            options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
            return any(option is list or typing.get_origin(option) is list for option in options)
    return False


def apply_overlay(
    params: dict[str, Any],
    path: str | Path,
    notebook_dir: Path = NOTEBOOK_DIR,
    sets: dict[str, Any] | None = None,
    source: str = "the params file",
    set_origins: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`params` with an overlay file laid over it, validated together with the run's `--set` values (`sets`); errors
    name the overlay, "--set" (or `set_origins`) or `source`. The rules: docs/runner.md."""
    overlay = load_params(path)
    conditional = overlay.pop("where_nonempty", {})
    if not isinstance(conditional, dict):
        raise ConfigError(f"{path}: where_nonempty must be a mapping of parameter names to lists")
    merged = {**params, **overlay}
    origins = {**{key: str(path) for key in overlay}, **{key: "--set" for key in sets or {}}, **(set_origins or {})}
    resolved = resolve({**merged, **(sets or {})}, source, notebook_dir, across=False, origins=origins)  # again later
    for key, value in conditional.items():
        current = [v[key] for v in resolved.values() if key in v]
        if not current:
            raise ConfigError(f"{path}: where_nonempty names {key!r}, which no notebook declares")
        if not _takes_a_list(key):  # it is never a non-empty list: the condition would never hold
            raise ConfigError(f"{path}: where_nonempty names {key!r}, which is not a list parameter (here it is "
                              f"{current[0]!r}); put it at the top level of the overlay to replace it")  # fmt: skip
        if not isinstance(value, list):
            raise ConfigError(f"{path}: where_nonempty gives {key!r} the value {value!r}; it replaces a list, so give "
                              "a list (e.g. [32, 16])")  # fmt: skip
        if any(v for v in current):
            merged[key] = value
    return merged


def parse_sets(items: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"--set {item!r}: the key is empty")
        if key in values:
            raise ConfigError(f"--set: the key {key!r} is given twice; keep one")
        try:
            values[key] = read_yaml(raw)
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {key}: the value {raw!r} does not parse as YAML: {err}") from None
    return values


def resolve(
    overrides: dict[str, Any],
    source: str,
    notebook_dir: Path = NOTEBOOK_DIR,
    across: bool = True,
    origins: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """{notebook: {key: value}} for every notebook, overrides validated; errors name the key and `origins[key]`, else
    `source`. `across`: also check the values that must agree across notebooks, and the paths."""

    def blame(keys: list[str]) -> tuple[str, list[str]]:  # where the first key came from, and the keys from there
        where = (origins or {}).get(keys[0], source)
        return where, [k for k in keys if (origins or {}).get(k, source) == where]

    forbidden = sorted(set(overrides) & set(RUN_KEYS))
    if forbidden:
        where, forbidden = blame(forbidden)
        raise ConfigError(f"{where}: {forbidden} are set by the runner (the run is named after the params file)")
    declared = {}
    for name in NOTEBOOKS:
        defaults = read_parameters(notebook_dir / f"{name}.ipynb")
        expected = stage_keys(name)
        if sorted(defaults) != sorted(expected):
            raise ConfigError(
                f"notebooks/{name}.ipynb declares {sorted(set(defaults) ^ set(expected))} out of step with its "
                "stage dataclasses"
            )
        declared[name] = defaults
    known = {k for d in declared.values() for k in d}
    unknown = sorted(set(overrides) - known)
    if unknown:
        where, unknown = blame(unknown)
        raise ConfigError(f"{where}: no notebook declares {unknown_keys(unknown, known)}")
    resolved = {}
    for name, defaults in declared.items():
        values = {**defaults, **{k: v for k, v in overrides.items() if k in defaults}}
        for cls in STAGES[name]:
            fields = cls.__dataclass_fields__
            try:
                from_dict(cls, {k: v for k, v in values.items() if k in fields}, "")
            except ConfigError as err:  # its message names the key: "parameter 'learning_rate' must be ..."
                named = re.search(r"parameter '(\w+)'", str(err))
                where, _ = blame([named.group(1) if named else ""])
                raise ConfigError(f"{where} (notebook {name}): {str(err).removeprefix(': ')}") from None
        resolved[name] = values
    if across:
        check_pma_dims(resolved, blame(["compare_pma_dims"])[0], notebook_dir)
        check_paths(resolved, source, notebook_dir, origins or {})
    return resolved


def check_paths(resolved: dict[str, dict[str, Any]], source: str, notebook_dir: Path, origins: dict[str, str]) -> None:
    """`hub_mirror` and a folder `backbone` must be folders as the notebooks see them (relative: from notebooks/)."""
    wanted = [(n, "hub_mirror", v["hub_mirror"]) for n, v in resolved.items() if v.get("hub_mirror") is not None]
    model = resolved.get("02_train_lora_contrastive", {})
    backbone = model.get("backbone")
    # a backbone naming a folder rather than a hub id ("owner/name")
    if isinstance(backbone, str) and (
        backbone.startswith((".", "/", "~")) or backbone.count("/") > 1 or Path(backbone).is_dir()
    ):
        wanted.append(("02_train_lora_contrastive", "backbone", backbone))
    for name, key, value in wanted:
        where = origins.get(key, source)
        path = Path(value)  # the notebooks do not expand '~' either
        seen = path if path.is_absolute() else notebook_dir / path
        if seen.is_dir():
            continue
        if path.is_absolute():
            raise ConfigError(f"{where} (notebook {name}): {key} {value!r} is not a folder")
        here = (
            f"; it exists from here ({Path.cwd()}): give its absolute path, {path.resolve()}" if path.is_dir() else ""
        )
        raise ConfigError(f"{where} (notebook {name}): {key} {value!r} is relative, and the notebooks run in "
                          f"notebooks/, where it names {seen}, which is not a folder{here}")  # fmt: skip


# hidden sizes of the backbones the params files name (their published configs), and of the tiny test model
HIDDEN_SIZES = {
    "Qwen/Qwen2.5-Coder-0.5B-Instruct": 896, "Qwen/Qwen2.5-Coder-0.5B": 896,
    "pypi-gguf:Qwen2.5-Coder-0.5B-Instruct": 896, "Qwen/Qwen2.5-Coder-7B-Instruct": 3584, "Qwen/Qwen2.5-Coder-7B": 3584,
    "tiny-random-qwen2": 64,
}  # fmt: skip


def hidden_size(backbone: str, notebook_dir: Path = NOTEBOOK_DIR) -> int | None:
    """The backbone's hidden size where it is known without loading it: a backbone above, or a local directory
    (relative to notebooks/, where the notebooks run) whose config.json states it; else None."""
    if backbone in HIDDEN_SIZES:
        return HIDDEN_SIZES[backbone]
    config = notebook_dir / Path(backbone).expanduser() / "config.json"
    try:
        size = json.loads(config.read_text()).get("hidden_size") if config.is_file() else None
    except (OSError, ValueError, AttributeError):  # unreadable, not JSON, not an object: the backbone loader says
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def check_pma_dims(resolved: dict[str, dict[str, Any]], source: str, notebook_dir: Path = NOTEBOOK_DIR) -> None:
    """With `pma` in notebook 06's `compare_poolings`, each of `compare_pma_dims` must split into notebook 02's
    `pma_heads` and be no wider than the backbone's hidden size."""
    study, model = resolved.get("06_recipe_comparison", {}), resolved.get("02_train_lora_contrastive", {})
    if "pma" not in study.get("compare_poolings", []) or "pma_heads" not in model:
        return
    dims, heads = study["compare_pma_dims"], model["pma_heads"]
    split = [d for d in dims if d % heads]
    if split:
        raise ConfigError(f"{source}: compare_pma_dims {split} (notebook 06) must be multiples of pma_heads = {heads} "
                          "(notebook 02): PMA splits its output into pma_heads slices")  # fmt: skip
    width = hidden_size(model["backbone"], notebook_dir)
    wide = [d for d in dims if width is not None and d > width]
    if wide:
        raise ConfigError(f"{source}: compare_pma_dims {wide} (notebook 06) are wider than the backbone's hidden size "
                          f"{width} ({model['backbone']}), the full embedding they are compared with")  # fmt: skip


def resolve_run(
    params_file: str | Path,
    sets: dict[str, Any] | None = None,
    overlay: str | Path | None = None,
    only: list[str] | None = None,
    notebook_dir: Path = NOTEBOOK_DIR,
    set_origins: dict[str, str] | None = None,
) -> tuple[str, dict[str, Any], dict[str, dict[str, Any]], list[str]]:
    """(run name, the overrides in effect, {notebook: values}, the notebooks chosen) of a params file with its
    overlay and `--set` values; `set_origins` names where a value of `sets` came from if not "--set"."""
    params_file = Path(params_file)
    name = check_run_name(params_file.stem, f"{params_file}: the run name (the file's stem)")
    given = load_params(params_file)
    origins = {}  # where each value that is not the params file's came from, for the errors
    if overlay is not None:
        merged = apply_overlay(given, overlay, notebook_dir, sets, str(params_file), set_origins)
        origins = {key: str(overlay) for key, value in merged.items() if key not in given or given[key] != value}
        given = merged
    given = {**given, **(sets or {})}
    origins |= {**{key: "--set" for key in sets or {}}, **(set_origins or {})}
    resolved = resolve(given, str(params_file), notebook_dir, origins=origins)
    return name, given, resolved, select_notebooks(only)


def select_notebooks(only: list[str] | None) -> list[str]:
    """The notebooks a run executes, in order: those `--only` names by number, else all but `ON_REQUEST`."""
    if not only:
        return [n for n in NOTEBOOKS if n not in ON_REQUEST]
    selected = [n for n in NOTEBOOKS if any(n.startswith(p) for p in only)]
    if len(selected) != len(only):
        raise ConfigError(f"--only {only}: choose among {', '.join(n[:2] for n in NOTEBOOKS)}")
    return selected
