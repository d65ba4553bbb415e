"""The pipeline runner: a params file resolved against the notebooks' parameters cells, then notebooks/01..07 run
through papermill into one run directory, each recorded in its manifest.

    python -m c2llm_lib.pipeline params/<run>.yaml [--only 02 03] [--set key=value ...] [--resume | --overwrite]

Its rules (what is refused before anything runs, `--only`, `--resume`, `--overwrite`, staleness, the paths outside a
run) are written once in docs/runner.md. Here `resolve` applies the validation, `rerun_reason` is the one
`--resume` rule, `not_current` the `--only` rule and `input_fingerprints` what a notebook's inputs are. The preflight
is a tool beside the library, `python -m tools.preflight` (docs/preflight.md): the runner's former `--preflight` flags
exit with status 2 and name that command.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import re
import shlex
import signal
import sys
import threading
import time
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from .checks import ConfigError, unknown_keys
from .config import PARAMS_DIR, LaunchConfig, from_dict
from .data.tree_walk import walked_files
from .files import CorruptFile, digest, fingerprint
from .hardware import PeakMemory
from .notebook import NOTEBOOK_DIR, ON_REQUEST, RUN_KEYS, STAGES, read_parameters, stage_keys
from .runs import OUTSIDE_INPUTS, PRODUCTS, RunDir, RunInUse, check_run_name, upstream

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = list(STAGES)
PREFLIGHT = "python -m tools.preflight PARAMS [--only ...] [--set ...] [--overlay ...]"  # make preflight
RESULTS = "04_eval_mteb_code"  # writes metrics/results.md, the table `main` prints
LAUNCH_KEYS = tuple(f.name for f in dataclasses.fields(LaunchConfig))  # where notebook 02 ran, not what it made


class PipelineError(RuntimeError):
    """A notebook failed; the message names it and where its executed copy is."""


class Terminated(Exception):
    """The runner received SIGTERM (a scheduler, `timeout`, `kill`): the running notebook fails, its kernel is shut
    down (and with it any training processes, which die with their parent), and the manifest says so."""


@contextlib.contextmanager
def sigterm_raises():
    """Within the block, SIGTERM raises `Terminated` in the main thread (elsewhere signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(f"the runner received {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class UpstreamNotCurrent(PipelineError):
    """With --only, a chosen notebook would read the products of a notebook that is not current; the message names
    that notebook, why, and the command that reruns it."""


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(f"the key {key!r} is given twice (lines {first} and {second}); keep one")


class ParamsLoader(yaml.SafeLoader):
    """YAML for params: refuses a key given twice in one mapping, and reads `1e-3`, `5E4` or `1.0e5` as floats
    (PyYAML follows YAML 1.1, whose floats need a dot and a signed exponent, so it reads those as strings)."""

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
    """`params` with an overlay file laid over it (e.g. params/overlays/rehearsal.yaml): its keys replace the file's,
    and the keys under `where_nonempty:` replace only a list the run has non-empty (in the file or as the notebook's
    default), so that an overlay scales what a recipe asks for without switching on what it does not. The run's
    `--set` values (`sets`, applied after the overlay) take part in that validation, since a params file may need
    one to be valid (params/own-code.yaml's code_roots); a bad value is blamed on where it came from: the overlay,
    "--set" (or what `set_origins` names for a value of `sets`) or the params file (`source`). A key under
    `where_nonempty` must be a list parameter and be given a list: anything else would be ignored, so it is refused."""
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
    """{notebook: {key: value}} for every notebook, overrides validated; errors name the key and where its value came
    from: `origins[key]` (an overlay, "--set"), else `source` (the params file). `across`: also the values that must
    agree across notebooks (off for an overlay's first pass: its where_nonempty values come after it)."""

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
        check_paths(resolved, source, notebook_dir, origins)
    return resolved


def _looks_like_a_path(value: str) -> bool:
    """A backbone that names a folder rather than a hub id ("owner/name"): it starts with '.', '/' or '~', or has
    more than one '/'."""
    return value.startswith((".", "/", "~")) or value.count("/") > 1


def check_paths(
    resolved: dict[str, dict[str, Any]],
    source: str,
    notebook_dir: Path = NOTEBOOK_DIR,
    origins: dict[str, str] | None = None,
) -> None:
    """`hub_mirror` (notebooks 01, 04) must be a folder, and a `backbone` (02) that names a folder must exist, seen
    from where the notebooks run: a relative path is resolved from notebooks/, not from where the runner started.
    Errors name where the value came from (`origins[key]`, else `source`)."""
    wanted = [(n, "hub_mirror", v["hub_mirror"]) for n, v in resolved.items() if v.get("hub_mirror") is not None]
    model = resolved.get("02_train_lora_contrastive", {})
    backbone = model.get("backbone")
    if isinstance(backbone, str) and (_looks_like_a_path(backbone) or Path(backbone).is_dir()):
        wanted.append(("02_train_lora_contrastive", "backbone", backbone))
    for name, key, value in wanted:
        where = (origins or {}).get(key, source)
        path = Path(value)  # the notebooks do not expand '~' either
        seen = path if path.is_absolute() else notebook_dir / path
        if seen.is_dir():
            continue
        if path.is_absolute():
            raise ConfigError(f"{where} (notebook {name}): {key} {value!r} is not a folder")
        here = (
            ""
            if not path.is_dir()
            else f"; it exists from here ({Path.cwd()}): give its absolute path, {path.resolve()}"
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
    """Notebook 06's pooling study trains PMA at each of `compare_pma_dims` with notebook 02's model: each d must split
    into its `pma_heads` and be no wider than the backbone's hidden size (the full embedding it is truncated from).
    Checked before anything runs, instead of failing in notebook 06 after its other trainings."""
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


def executed_state(path: Path) -> tuple[bool, dict[str, Any] | None]:
    """(complete, parameters) of an executed notebook: complete when papermill recorded an end and no exception
    and every code cell ran (a dead kernel records no exception but leaves the cells after it unexecuted)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    meta = nb.metadata.get("papermill", {})
    ran = all(c.get("execution_count") is not None for c in nb.cells if c.cell_type == "code" and c.source.strip())
    return ran and meta.get("exception") is None and meta.get("end_time") is not None, meta.get("parameters")


def finished(path: Path, parameters: dict[str, Any]) -> bool:
    """Whether an executed notebook completed without error with exactly these parameters."""
    if not path.is_file():
        return False
    complete, used = executed_state(path)
    return complete and used == parameters


def _last_cell(path: Path) -> str:
    """' in cell [N]' for the last cell an executed notebook ran (where a dead kernel died), or ''."""
    import nbformat

    try:
        cells = nbformat.read(path, as_version=4).cells
    except (OSError, ValueError):
        return ""
    counts = [c.get("execution_count") for c in cells if c.cell_type == "code" and c.get("execution_count")]
    return f" in cell [{counts[-1]}]" if counts else ""


def kernel_config():
    """The settings of papermill's kernels: CurveZMQ keys for their sockets, and a kernel log without the shutdown's
    "KeyboardInterrupt caught in kernel." line.

    papermill talks to its kernel over TCP on localhost, and ipykernel (7.x) warns at every kernel start that the
    traffic is not encrypted ("Kernel is running over TCP without encryption"). With `transport_encryption="auto"`
    jupyter_client provisions keys when the kernelspec declares support (ipykernel's does), so the traffic is
    encrypted and the kernel has nothing to warn about; a jupyter_client without the setting gets none (its kernels
    predate the warning).

    After the last cell papermill asks the kernel for its info, and as soon as the reply arrives it shuts the kernel
    down, and jupyter_client interrupts (SIGINT) a kernel before it asks it to shut down. When the interrupt lands
    before the kernel has left its handler for that request (a busy CPU widens the gap), ipykernel catches the
    KeyboardInterrupt and logs "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel." in a run that succeeded.
    Every kernel therefore starts with a filter on its log that drops that line only (`exec_lines`, run before the
    notebook and leaving no name behind): an interrupt of a running cell is the cell's error, reported by papermill,
    and every other kernel error is still logged."""
    from jupyter_client import KernelManager
    from traitlets.config import Config

    quiet = ("--IPKernelApp.exec_lines=get_ipython().kernel.log.addFilter("
             "lambda record: not record.getMessage().startswith('KeyboardInterrupt caught in kernel'))")  # fmt: skip
    config = Config({"NotebookClient": {"extra_arguments": [quiet]}})
    if "transport_encryption" in KernelManager.class_trait_names():
        config.KernelManager.transport_encryption = "auto"
    return config


def notebook_html(path: Path) -> str:
    """An executed notebook as one HTML page (nbconvert's lab template, figures inline), for reading a run without
    a kernel."""
    import nbformat
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nbformat.read(path, as_version=4))
    return body


def _save_html(run: RunDir, name: str, executed: Path, log) -> None:
    """Saves notebooks/<name>.html beside the executed notebook; a failed export is reported, never raised (the
    notebook's own outcome is what the run records)."""
    if not executed.is_file():
        return
    try:
        run.save_notebook_html(name, notebook_html(executed))
    except Exception as err:  # an exporter or template problem must not hide the notebook's result
        log(f"[{name}] no HTML copy: {type(err).__name__}: {err}")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def reason_to_rerun(
    record: dict[str, Any],
    executed: Path,
    parameters: dict[str, Any],
    inputs: dict[str, str],
    ignore: tuple[str, ...] = (),
) -> str:
    """Why `--resume` must rerun a notebook; '' when what it produced earlier still stands: the manifest says it
    finished, its executed copy is complete with these parameters (those in `ignore` aside), and its inputs have the
    recorded fingerprints."""
    if not executed.is_file():
        return "it has not run"
    try:
        complete, used = executed_state(executed)
    except (OSError, ValueError) as err:  # nbformat's NotJSONError is a ValueError
        return f"its executed copy is unreadable ({type(err).__name__})"
    if record.get("status") not in ("finished", "stale") or not complete:  # stale: its inputs say why, below
        return f"it did not finish (status {record.get('status', 'unknown')!r})"
    used = used or {}
    changed = sorted(k for k in set(parameters) | set(used) if used.get(k) != parameters.get(k) and k not in ignore)
    if changed:
        return f"its parameters changed: {', '.join(changed)}"
    recorded = record.get("inputs")
    if recorded is None:
        return "its inputs were not recorded"
    changed = sorted(k for k in set(inputs) | set(recorded) if inputs.get(k) != recorded.get(k))
    return f"its inputs changed since it ran: {', '.join(changed)}" if changed else ""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


# Parameters naming files or folders outside the run that a notebook reads (a relative path from notebooks/, where the
# notebooks run): its inputs (`input_fingerprints`, but for notebook 07's, which always reruns), and never inside the
# run directory (`check_outside_paths`). A backbone or eval_released that names nothing on disk is a hub id.
OUTSIDE_PATHS = {
    "01_data_prep": ("data_files", "code_roots", "hub_mirror"),
    "02_train_lora_contrastive": ("backbone",),
    "04_eval_mteb_code": ("hub_mirror", "beir_sets", "eval_released"),
    "07_search_code": ("search_roots", "code_roots"),
}
CODE_ROOTS = ("code_roots", "search_roots")  # walked by the mining rules (`tree_walk.walked_files`)


def outside_paths(name: str, values: dict[str, Any], notebook_dir: Path = NOTEBOOK_DIR) -> list[tuple[str, str, Path]]:
    """(key, value as given, the path as notebook `name` sees it) of each path outside the run that its parameters
    `values` name (`OUTSIDE_PATHS`; a `data_files` entry by its `path`)."""
    found = []
    for key in OUTSIDE_PATHS.get(name, ()):
        value = values.get(key)
        for item in value if isinstance(value, list) else [] if value is None else [value]:
            given = item.get("path") if isinstance(item, dict) else item
            if not isinstance(given, str):
                continue
            path = Path(given).expanduser()
            path = path if path.is_absolute() else notebook_dir / path
            if key in ("backbone", "eval_released") and not path.exists():
                continue  # a hub id (the loaders take a name that exists on disk as a folder)
            found.append((key, given, path))
    return found


def outside_fingerprint(key: str, path: Path) -> str:
    """The fingerprint of an input outside the run, by the one rule (`files.digest`: names, sizes, the bytes of every
    file up to 4 MiB, larger ones by their modification time). A code root covers the files its mining walks
    (`tree_walk.walked_files`: source files the path and .gitignore rules keep, so a whole site-packages hashes its
    source files only, as mining reads them); any other folder every file under it (`files.fingerprint`, hidden
    entries and `cache-*` files aside). "missing" when absent, "unreadable (...)" when it cannot be read."""
    try:
        if key in CODE_ROOTS and path.is_dir():
            return digest(walked_files(path))
        return fingerprint(path, key)
    except (OSError, ValueError) as err:  # a DataError is a ValueError
        return f"unreadable ({type(err).__name__})"


def check_outside_paths(resolved: dict[str, dict[str, Any]], root: Path, notebook_dir: Path = NOTEBOOK_DIR) -> None:
    """Refuses, naming the key and path, an input outside the run (`outside_paths`) that lies inside the run directory
    `root` (a code root in outputs/<run>/): `--overwrite` deletes the run directory whole, and a rerun replaces its
    notebook's products. Checked in every mode, before anything is deleted."""
    real = root.resolve()
    for name, values in resolved.items():
        for key, given, path in outside_paths(name, values, notebook_dir):
            if path.resolve().is_relative_to(real):
                raise ConfigError(
                    f"{key} {given!r} (notebook {name}) lies inside the run directory {root} "
                    f"({path.resolve()}), which --overwrite deletes: move it out of {root}"
                )


def input_fingerprints(run: RunDir, name: str, parameters: dict[str, Any], notebook_dir: Path) -> dict[str, str]:
    """{input: fingerprint} of everything notebook `name` reads: the run files (`RunDir.input_fingerprints`), the code
    cells of its notebook ("notebook code"; its prose changes no result), for notebook 06 each recipe file it reads
    ("recipe params/<name>.yaml", "missing" when absent), and each path outside the run its parameters name
    (`outside_paths`: "code_roots ../src", "backbone /models/qwen", ...; `outside_fingerprint`). Notebook 07 always
    reruns (`runs.OUTSIDE_INPUTS`): its outside folders are not fingerprinted."""
    import nbformat

    inputs = run.input_fingerprints(name)
    try:
        cells = nbformat.read(notebook_dir / f"{name}.ipynb", as_version=4).cells
        code = "\0".join(c.source for c in cells if c.cell_type == "code")
        inputs["notebook code"] = _digest(code.encode())
    except (OSError, ValueError) as err:  # the notebook itself reports an unreadable file when it runs
        inputs["notebook code"] = f"unreadable ({type(err).__name__})"
    if name == "06_recipe_comparison":
        for recipe in parameters.get("compare_recipes") or []:
            path = Path(PARAMS_DIR) / f"{recipe}.yaml"
            inputs[f"recipe params/{recipe}.yaml"] = _digest(path.read_bytes()) if path.is_file() else "missing"
    if name not in OUTSIDE_INPUTS:
        for key, given, path in outside_paths(name, parameters, notebook_dir):
            inputs[f"{key} {given}"] = outside_fingerprint(key, path)
    return inputs


def rerun_reason(
    run: RunDir, name: str, parameters: dict[str, Any], record: dict[str, Any], notebook_dir: Path
) -> tuple[str, dict[str, str]]:
    """(why notebook `name` must run again, '' when what it made earlier stands; its inputs' fingerprints now). The
    one rule of `--resume`, of `not_current`, and of every machine of a launch (`training_reason`): what it
    made stands when it finished, with these parameters (`LAUNCH_KEYS` aside: where notebook 02 ran does not change
    what it made), with the recorded fingerprints of its inputs, and every run file it made for later notebooks
    (`RunDir.made`, recorded when it finished) is still there: a deleted metrics/train.json reruns notebook 02 rather
    than failing notebook 03 at every --resume."""
    inputs = input_fingerprints(run, name, parameters, notebook_dir)
    executed = run.root / "notebooks" / f"{name}.ipynb"
    reason = reason_to_rerun(record, executed, parameters, inputs, ignore=LAUNCH_KEYS)
    gone = [] if reason else [relative for relative in record.get("made", ()) if not run.present(relative)]
    return reason or (f"what it made for later notebooks is gone: {', '.join(gone)}" if gone else ""), inputs


def _unread(relative: str, inputs: dict[str, str], producer: dict[str, Any]) -> bool:
    """Whether a run file a notebook may read is absent because its producer never made it (an option not asked,
    data/heldout of an offline run), not because it was deleted after."""
    return inputs.get(relative) == "missing" and relative not in producer.get("made", ())


def not_current(
    run: RunDir,
    name: str,
    resolved: dict[str, dict[str, Any]],
    records: dict[str, Any],
    notebook_dir: Path,
    rerun: tuple[str, ...] = (),
    seen: dict[str, tuple[str, list[str]]] | None = None,
) -> tuple[str, list[str]]:
    """(why notebook `name`'s products do not stand for this run, the notebooks to rerun for them), or ('', []) when
    they do: `rerun_reason` finds none for it nor for any notebook upstream whose product it read, and none of those
    is in `rerun`. `seen`: the answers already found for the same `rerun` (an input is fingerprinted once)."""
    seen = {} if seen is None else seen
    if name in seen:
        return seen[name]
    seen[name] = _not_current(run, name, resolved, records, notebook_dir, rerun, seen)
    return seen[name]


def _not_current(run, name, resolved, records, notebook_dir, rerun, seen) -> tuple[str, list[str]]:
    reason, inputs = rerun_reason(run, name, resolved[name], records.get(name, {}), notebook_dir)
    if reason:
        return reason, [name]
    for relative, producer in upstream(name).items():
        if _unread(relative, inputs, records.get(producer, {})):
            continue
        if producer in rerun:
            return f"it read {relative} from {producer}, which this run reruns", [name]
        below, chain = not_current(run, producer, resolved, records, notebook_dir, rerun, seen)
        if below:
            return f"it read {relative} from {producer}, which is not current: {below}", [*chain, name]
    return "", []


def _records(run: RunDir) -> dict[str, Any]:
    """The manifest's per-notebook records ({} for a new run)."""
    records = run.read_manifest().get("notebooks") if (run.root / "manifest.json").is_file() else None
    return dict(records) if isinstance(records, dict) else {}


def check_upstream(
    run: RunDir, selected: list[str], resolved: dict[str, dict[str, Any]], params_file: str, notebook_dir: Path
) -> None:
    """Refuses (`UpstreamNotCurrent`) a chosen notebook that reads a product of a notebook that does not run and is
    not current (`not_current`), naming both and the command that reruns what is stale."""
    records, seen = _records(run), {}
    for name in selected:
        outside = {relative: producer for relative, producer in upstream(name).items() if producer not in selected}
        present = run.input_fingerprints(name) if outside else {}
        for relative, producer in outside.items():
            if _unread(relative, present, records.get(producer, {})):
                continue
            reason, chain = not_current(run, producer, resolved, records, notebook_dir, tuple(selected), seen)
            if reason:
                chosen = " ".join(n[:2] for n in NOTEBOOKS if n in {*chain, *selected})
                raise UpstreamNotCurrent(
                    f"--only {' '.join(n[:2] for n in selected)}: {name} reads {relative} from {producer}, which is "
                    f"not current ({reason}). Run python -m c2llm_lib.pipeline {params_file} --resume --only {chosen}"
                    " (with this run's --set and --overlay), or --resume without --only to rerun whatever is stale"
                )


def check_outputs(outputs: Path) -> None:
    """The outputs folder (`--outputs`) must be a folder, or be creatable: no file where it or a parent should be."""
    existing = next((p for p in (outputs, *outputs.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "is a file" if existing == outputs else f"lies under {existing}, which is a file"
        raise ConfigError(f"--outputs {outputs}: {where}, not a folder for run directories; choose a folder")


def resolve_run(
    params_file: str | Path,
    sets: dict[str, Any] | None = None,
    overlay: str | Path | None = None,
    only: list[str] | None = None,
    notebook_dir: Path = NOTEBOOK_DIR,
    set_origins: dict[str, str] | None = None,
) -> tuple[str, dict[str, Any], dict[str, dict[str, Any]], list[str]]:
    """(run name, the overrides in effect, {notebook: values}, the notebooks chosen) of a params file with its
    overlay and `--set` values, as a run uses them (the preflight resolves through here too). An error names where
    the bad value came from: the params file, the overlay, "--set", or for a value of `sets` given otherwise (the
    launcher's --node-rank) what `set_origins` says."""
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
    """The notebooks a run executes, in order: those named by `--only` (their numbers), else every notebook but the
    ones that run only when named (`notebook.ON_REQUEST`: notebook 07)."""
    if not only:
        return [n for n in NOTEBOOKS if n not in ON_REQUEST]
    selected = [n for n in NOTEBOOKS if any(n.startswith(p) for p in only)]
    if len(selected) != len(only):
        raise ConfigError(f"--only {only}: choose among {', '.join(n[:2] for n in NOTEBOOKS)}")
    return selected


def _run_root(outputs: str | Path, name: str, resolved: dict[str, dict[str, Any]]) -> Path:
    """The run directory `<outputs>/<name>`, its place given to every notebook (`RUN_KEYS`, in `resolved`)."""
    root = Path(outputs) / name
    for values in resolved.values():
        values.update(run=name, outputs_dir=str(root.parent.resolve()))
    return root


TRAIN = "02_train_lora_contrastive"


def training_reason(
    params_file: str | Path,
    sets: dict[str, Any],
    overlay: str | Path | None,
    outputs: str | Path,
    notebook_dir: Path = NOTEBOOK_DIR,
) -> str:
    """What node 0 of a launch decides, for the other machines (`launch.py`): why its `--resume --only 02` trains
    (they must join), or '' when it keeps the finished training (they have nothing to join): the same checks
    (`check_upstream`) and the same rule (`rerun_reason`) on the same parameters, node 0's."""
    name, _, resolved, selected = resolve_run(params_file, {**sets, "node_rank": 0}, overlay, ["02"], notebook_dir)
    run = RunDir(_run_root(outputs, name, resolved))
    check_upstream(run, selected, resolved, str(params_file), notebook_dir)
    return rerun_reason(run, TRAIN, resolved[TRAIN], _records(run).get(TRAIN, {}), notebook_dir)[0]


def run_pipeline(
    params_file: str | Path,
    only: list[str] | None = None,
    sets: dict[str, Any] | None = None,
    mode: str = "new",
    outputs: str | Path = REPO / "outputs",
    notebook_dir: Path = NOTEBOOK_DIR,
    log=print,
    overlay: str | Path | None = None,
) -> RunDir:
    params_file = Path(params_file)
    check_outputs(Path(outputs))
    name, given, resolved, selected = resolve_run(params_file, sets, overlay, only, notebook_dir)
    root = _run_root(outputs, name, resolved)
    check_outside_paths(resolved, root, notebook_dir)
    if mode != "new":  # before --overwrite deletes anything
        check_upstream(RunDir(root), selected, resolved, str(params_file), notebook_dir)
    # --overwrite --only NN replaces only NN's products; the files it reads stay
    replace = [p for n in selected for p in (*PRODUCTS[n], f"notebooks/{n}.*")] if only else None  # .ipynb, .html
    run = RunDir.create(root, mode, replace=replace)
    try:
        with sigterm_raises():
            _run_notebooks(run, str(params_file), given, resolved, selected, mode == "resume", notebook_dir, log,
                           overlay=str(overlay) if overlay is not None else None)  # fmt: skip
    except Terminated as err:  # between notebooks (within one, the notebook records it as its failure)
        if run.read_manifest().get("status") == "running":
            run.write_manifest(REPO, status="failed", error=str(err), ended=_now())
        raise PipelineError(f"{err}; the run stopped (--resume continues it)") from None
    finally:
        run.release()
    return run


def _run_notebooks(
    run: RunDir,
    params_file: str,
    given: dict[str, Any],
    resolved: dict[str, dict[str, Any]],
    selected: list[str],
    resume: bool,
    notebook_dir: Path,
    log,
    overlay: str | None = None,
) -> None:
    import papermill
    from nbclient.exceptions import DeadKernelError

    records = _records(run)  # {notebook: {status, inputs, ...}}
    if run.read_manifest().get("status") == "running":  # this runner holds the lock: the one that wrote it is gone
        for name, record in records.items():
            if record.get("status") in ("running", "pending"):
                records[name] = {**record, "status": "failed", "error": "its runner died (killed) while it ran"}
                log(f"[{name}] the previous runner of this run died while it ran (killed?): recorded as failed")
    earlier = dict(records)
    records.update({name: {"status": "pending"} for name in selected})
    run.write_params(given, resolved)

    def save(**extra: Any) -> None:
        run.write_manifest(REPO, params_file=params_file, overlay=overlay, selected=selected, notebooks=records,
                           **extra)  # fmt: skip

    save(status="running", drop=("failed_notebook", "error", "ended"))
    for name in selected:
        run.check_lock()  # its lock file deleted meanwhile: take a new one, or stop if another runner did
        executed = run.root / "notebooks" / f"{name}.ipynb"
        if resume:
            reason, inputs = rerun_reason(run, name, resolved[name], earlier.get(name, {}), notebook_dir)
            reason = reason or OUTSIDE_INPUTS.get(name, "")
        else:
            reason, inputs = "", input_fingerprints(run, name, resolved[name], notebook_dir)
        if resume and not reason:
            records[name] = {k: v for k, v in earlier[name].items() if k != "reason"} | {"status": "finished"}
            log(f"[{name}] done earlier with the same parameters and inputs: kept")
            continue
        log(f"[{name}] running" + (f" ({reason})" if reason else "") + " ...")
        run.remove_products(name)  # nothing it wrote before stays beside what it writes now (its caches aside)
        records[name] = {"status": "running", "started": _now(), "inputs": inputs}
        save()
        start = time.perf_counter()
        peak = PeakMemory()  # the kernel's peak resident memory, and any process it starts
        try:
            with peak:
                papermill.execute_notebook(
                    str(notebook_dir / f"{name}.ipynb"),
                    str(executed),
                    parameters=resolved[name],
                    cwd=str(notebook_dir),
                    kernel_name="python3",
                    progress_bar=False,
                    config=kernel_config(),
                )
        except BaseException as err:
            if isinstance(err, papermill.PapermillExecutionError):
                error = f"{name} failed in cell {err.exec_count}: {err.ename}: {err.evalue}"
            elif isinstance(err, DeadKernelError):
                error = f"{name} failed: its kernel died{_last_cell(executed)} (killed, or out of memory)"
            elif isinstance(err, Exception):
                error = f"{name} failed: {type(err).__name__}: {err}"
            else:
                error = f"{name} was interrupted ({type(err).__name__})"
            status = "failed" if isinstance(err, Exception) else "interrupted"
            if isinstance(err, Exception):  # the failed notebook's HTML, with its error, is the first thing to read
                _save_html(run, name, executed, log)
            records[name].update(status=status, seconds=round(time.perf_counter() - start, 1), peak_rss_kib=peak.kib)
            for later in selected[selected.index(name) + 1 :]:
                records[later] = {"status": "not reached"}
            save(status=status, failed_notebook=name, error=error, ended=_now())
            if not isinstance(err, Exception):  # KeyboardInterrupt, SystemExit: recorded, then passed on
                raise
            html = executed.with_suffix(".html")
            saved = f"the executed notebook, with the error, is saved at {executed}" if executed.is_file() else (
                f"no executed notebook was saved (expected at {executed})")  # fmt: skip
            saved += f" (to read in a browser: {html})" if html.is_file() else ""
            raise PipelineError(f"{error}\n{saved}\n--resume reruns it and what follows") from None
        _save_html(run, name, executed, log)
        records[name].update(status="finished", seconds=round(time.perf_counter() - start, 1), ended=_now(),
                             peak_rss_kib=peak.kib, made=run.made(name))  # fmt: skip
        save()
        memory = f", peak resident memory {peak.kib / 2**20:.2f} GiB" if peak.kib else ""
        log(f"[{name}] finished in {time.perf_counter() - start:.0f}s{memory}")
    seen: dict[str, tuple[str, list[str]]] = {}
    for name, record in records.items():  # earlier results that no longer stand for this run (e.g. after --only 02)
        if name not in selected and record.get("status") in ("finished", "stale"):
            reason, _ = not_current(run, name, resolved, records, notebook_dir, seen=seen)
            current = {k: v for k, v in record.items() if k != "reason"}
            records[name] = (
                {**current, "status": "stale", "reason": reason} if reason else {**current, "status": "finished"}
            )
    save(status="finished", ended=_now())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the C2LLM notebooks in order through papermill.")
    parser.add_argument("params", help="params/<run>.yaml: flat overrides; the run is named after the file")
    parser.add_argument("--only", nargs="+", metavar="NN", help="run only these notebooks, e.g. --only 04 05")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                        help="override single keys of the params file (each key once)")  # fmt: skip
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--resume", action="store_true",
        help="keep the notebooks that finished with the same parameters and unchanged inputs, run the rest",
    )  # fmt: skip
    group.add_argument(
        "--overwrite", action="store_true",
        help="delete the existing run directory first; with --only, delete and rerun only those notebooks' "
        "products (e.g. --overwrite --only 04 replaces the evaluation and keeps data, checkpoints and merged/)",
    )  # fmt: skip
    group.add_argument("--preflight", action="store_true", help=f"moved: {PREFLIGHT} (the runner refuses it)")
    for flag in ("--preflight-memory-gb", "--preflight-disk-gb", "--preflight-steps"):
        parser.add_argument(flag, metavar="VALUE", help=f"moved: {PREFLIGHT} --{flag.removeprefix('--preflight-')} ...")
    parser.add_argument("--outputs", default=str(REPO / "outputs"), help="where run directories live")
    parser.add_argument(
        "--overlay", metavar="YAML",
        help="a file laid over the params file before --set, e.g. params/overlays/rehearsal.yaml (the recipe on a CPU "
        "with no hub, sizes scaled down)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.preflight or any(getattr(args, f"preflight_{n}") is not None for n in ("memory_gb", "disk_gb", "steps")):
        print(f"error: the preflight is a tool beside the runner now: {preflight_command(args)}", file=sys.stderr)
        return 2
    mode = "resume" if args.resume else "overwrite" if args.overwrite else "new"
    try:
        run = run_pipeline(args.params, args.only, parse_sets(args.set), mode, args.outputs, overlay=args.overlay)
    except (ConfigError, FileExistsError, PipelineError, RunInUse, CorruptFile) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"results: {run.root}  (metrics/, figures/, notebooks/)")
    table = results_table(run, args.params)
    if table:
        print(table)
    return 0


def results_table(run: RunDir, params_file: str) -> str:
    """metrics/results.md when notebook 04 is current in the run's manifest; else a line saying that the table is
    stale and why (it was written for another model, e.g. after --only 01 02 03 with a new learning rate), or ''
    when there is none."""
    summary = run.root / "metrics" / "results.md"
    if not summary.is_file():
        return ""
    record = run.read_manifest().get("notebooks", {}).get(RESULTS) or {}
    status = record.get("status", "not recorded")
    if status == "finished":
        return summary.read_text()
    why = f" ({record['reason']})" if record.get("reason") else ""
    return (
        f"metrics/results.md is stale: {RESULTS} is {status}{why}, so its table is not this run's.\n"
        f"python -m c2llm_lib.pipeline {params_file} --resume (with this run's --set) reruns what is stale"
    )


def preflight_command(args: argparse.Namespace) -> str:
    """The `python -m tools.preflight` command that checks what the runner's former `--preflight` (with these
    arguments) checked: the same params, --only, --set, --overlay and --outputs, its limits without the prefix."""
    cmd = ["python", "-m", "tools.preflight", args.params]
    cmd += ["--only", *args.only] if args.only else []
    cmd += ["--set", *args.set] if args.set else []
    cmd += ["--overlay", args.overlay] if args.overlay else []
    cmd += ["--outputs", args.outputs] if args.outputs != str(REPO / "outputs") else []
    for name in ("memory_gb", "disk_gb", "steps"):
        value = getattr(args, f"preflight_{name}")
        cmd += [f"--{name.replace('_', '-')}", value] if value is not None else []
    return shlex.join(cmd)


if __name__ == "__main__":
    sys.exit(main())
