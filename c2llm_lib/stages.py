"""The stage graph and what `--resume` reruns: each notebook's inputs fingerprinted, and the one rule that says whether
what a notebook made earlier still stands (`rerun_reason`), for itself and upstream (`not_current`); docs/runner.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

from .checks import ConfigError
from .config import PARAMS_DIR, LaunchConfig
from .data.tree_walk import walked_files
from .files import digest, fingerprint
from .notebook import NOTEBOOK_DIR
from .runs import OUTSIDE_INPUTS, RunDir, upstream

LAUNCH_KEYS = tuple(f.name for f in dataclasses.fields(LaunchConfig))  # where notebook 02 ran, not what it made


def executed_state(path: Path) -> tuple[bool, dict[str, Any] | None]:
    """(complete, parameters) of an executed notebook: complete when papermill recorded an end and no exception
    and every code cell ran (a dead kernel records no exception but leaves the cells after it unexecuted)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    meta = nb.metadata.get("papermill", {})
    ran = all(c.get("execution_count") is not None for c in nb.cells if c.cell_type == "code" and c.source.strip())
    return ran and meta.get("exception") is None and meta.get("end_time") is not None, meta.get("parameters")


def reason_to_rerun(
    record: dict[str, Any],
    executed: Path,
    parameters: dict[str, Any],
    inputs: dict[str, str],
) -> str:
    """Why `--resume` must rerun a notebook, or '' when it finished, complete, with these parameters (`LAUNCH_KEYS`
    aside) and its inputs' recorded fingerprints."""
    if not executed.is_file():
        return "it has not run"
    try:
        complete, used = executed_state(executed)
    except (OSError, ValueError) as err:  # nbformat's NotJSONError is a ValueError
        return f"its executed copy is unreadable ({type(err).__name__})"
    if record.get("status") not in ("finished", "stale") or not complete:  # stale: its inputs say why, below
        return f"it did not finish (status {record.get('status', 'unknown')!r})"
    used = used or {}
    keys = (set(parameters) | set(used)) - set(LAUNCH_KEYS)
    changed = sorted(k for k in keys if used.get(k) != parameters.get(k))
    if changed:
        return f"its parameters changed: {', '.join(changed)}"
    recorded = record.get("inputs")
    if recorded is None:
        return "its inputs were not recorded"
    changed = sorted(k for k in set(inputs) | set(recorded) if inputs.get(k) != recorded.get(k))
    return f"its inputs changed since it ran: {', '.join(changed)}" if changed else ""


# Parameters naming paths outside the run that a notebook reads (relative ones from notebooks/); a backbone or
# eval_released that names nothing on disk is a hub id
OUTSIDE_PATHS = {
    "01_data_prep": ("data_files", "code_roots", "hub_mirror"),
    "02_train_lora_contrastive": ("backbone",),
    "04_eval_mteb_code": ("hub_mirror", "beir_sets", "eval_released"),
    "07_search_code": ("search_roots", "code_roots"),
}
CODE_ROOTS = ("code_roots", "search_roots")  # walked by the mining rules (`tree_walk.walked_files`)


def outside_paths(name: str, values: dict[str, Any], notebook_dir: Path = NOTEBOOK_DIR) -> list[tuple[str, str, Path]]:
    """(key, value as given, path as notebook `name` sees it) of each outside path `values` names (`OUTSIDE_PATHS`)."""
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
    """The fingerprint of an input outside the run: a code root by the files its mining walks, anything else by
    `files.fingerprint`; "missing" when absent, "unreadable (...)" when it cannot be read."""
    try:
        if key in CODE_ROOTS and path.is_dir():
            return digest(walked_files(path))
        return fingerprint(path, key)
    except (OSError, ValueError) as err:  # a DataError is a ValueError
        return f"unreadable ({type(err).__name__})"


def check_outside_paths(resolved: dict[str, dict[str, Any]], root: Path, notebook_dir: Path = NOTEBOOK_DIR) -> None:
    """Refuses an input outside the run (`outside_paths`) that lies inside `root`, which `--overwrite` deletes."""
    real = root.resolve()
    for name, values in resolved.items():
        for key, given, path in outside_paths(name, values, notebook_dir):
            if path.resolve().is_relative_to(real):
                raise ConfigError(
                    f"{key} {given!r} (notebook {name}) lies inside the run directory {root} "
                    f"({path.resolve()}), which --overwrite deletes: move it out of {root}"
                )


def input_fingerprints(run: RunDir, name: str, parameters: dict[str, Any], notebook_dir: Path) -> dict[str, str]:
    """{input: fingerprint} of everything notebook `name` reads (docs/runner.md#new-runs---overwrite-and---resume):
    run files, its code cells, notebook 06's recipe files, and the paths outside the run its parameters name."""
    import nbformat

    inputs = run.input_fingerprints(name)
    try:
        cells = nbformat.read(notebook_dir / f"{name}.ipynb", as_version=4).cells
        code = "\0".join(c.source for c in cells if c.cell_type == "code")
        inputs["notebook code"] = hashlib.sha256(code.encode()).hexdigest()[:16]  # of its code cells, not the file
    except (OSError, ValueError) as err:  # the notebook itself reports an unreadable file when it runs
        inputs["notebook code"] = f"unreadable ({type(err).__name__})"
    if name == "06_recipe_comparison":
        for recipe in parameters.get("compare_recipes") or []:
            path = Path(PARAMS_DIR) / f"{recipe}.yaml"
            inputs[f"recipe params/{recipe}.yaml"] = fingerprint(path, f"params/{recipe}.yaml")  # "missing" if absent
    if name not in OUTSIDE_INPUTS:
        for key, given, path in outside_paths(name, parameters, notebook_dir):
            inputs[f"{key} {given}"] = outside_fingerprint(key, path)
    return inputs


def rerun_reason(
    run: RunDir, name: str, parameters: dict[str, Any], record: dict[str, Any], notebook_dir: Path
) -> tuple[str, dict[str, str]]:
    """(why notebook `name` must run again, '' when what it made earlier stands; its inputs' fingerprints now): the
    one rule of `--resume`, `not_current` and `training_reason` (docs/runner.md#new-runs---overwrite-and---resume)."""
    inputs = input_fingerprints(run, name, parameters, notebook_dir)
    executed = run.root / "notebooks" / f"{name}.ipynb"
    reason = reason_to_rerun(record, executed, parameters, inputs)
    gone = [] if reason else [relative for relative in record.get("made", ()) if not run.present(relative)]
    return reason or (f"what it made for later notebooks is gone: {', '.join(gone)}" if gone else ""), inputs


def unread(relative: str, inputs: dict[str, str], producer: dict[str, Any]) -> bool:
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
    """(why notebook `name`'s products do not stand for this run, the notebooks to rerun for them), or ('', []): it and
    every notebook upstream whose product it read pass `rerun_reason` and are not in `rerun`. `seen` memoises."""
    seen = {} if seen is None else seen
    if name not in seen:
        seen[name] = _not_current(run, name, resolved, records, notebook_dir, rerun, seen)
    return seen[name]


def _not_current(run, name, resolved, records, notebook_dir, rerun, seen) -> tuple[str, list[str]]:
    reason, inputs = rerun_reason(run, name, resolved[name], records.get(name, {}), notebook_dir)
    if reason:
        return reason, [name]
    for relative, producer in upstream(name).items():
        if unread(relative, inputs, records.get(producer, {})):
            continue
        if producer in rerun:
            return f"it read {relative} from {producer}, which this run reruns", [name]
        below, chain = not_current(run, producer, resolved, records, notebook_dir, rerun, seen)
        if below:
            return f"it read {relative} from {producer}, which is not current: {below}", [*chain, name]
    return "", []


def records_of(run: RunDir) -> dict[str, Any]:
    """The manifest's per-notebook records ({} for a new run)."""
    records = run.read_manifest().get("notebooks")
    return dict(records) if isinstance(records, dict) else {}
