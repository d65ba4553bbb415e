"""The pipeline runner: notebooks/01..05 in order through papermill, one run directory per params file.

    python -m c2llm_lib.pipeline params/<run>.yaml [--only 02 03] [--set key=value ...]
                                 [--resume | --overwrite] [--outputs DIR]

A params file holds flat overrides; the run is named after the file. Before anything runs, every
override must be declared by some notebook's parameters cell (papermill itself only warns), must not
be a derived key (run, outputs_dir), and must validate in the stage dataclasses of every notebook
declaring it. Each notebook receives exactly the keys it declares. A new run refuses an existing run
directory; `--resume` keeps what finished with the same parameters and reruns the rest; `--overwrite`
deletes the old run first. The first failing notebook stops the run; it is saved executed, with the
error, and the error is printed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError, from_dict, unknown_keys
from .notebook import NOTEBOOK_DIR, RUN_KEYS, STAGES, read_parameters, stage_keys
from .runs import RunDir

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = list(STAGES)


class PipelineError(RuntimeError):
    """A notebook failed; the message names it and where its executed copy is."""


def load_params(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such params file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: does not parse as YAML: {err}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigError(f"{path}: must be a flat mapping of parameter names to values")
    return data


def parse_sets(items: list[str]) -> dict[str, Any]:
    values = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        values[key.strip()] = yaml.safe_load(raw)
    return values


def resolve(overrides: dict[str, Any], source: str, notebook_dir: Path = NOTEBOOK_DIR) -> dict[str, dict[str, Any]]:
    """{notebook: {key: value}} for every notebook, overrides validated; errors name source and key."""
    forbidden = sorted(set(overrides) & set(RUN_KEYS))
    if forbidden:
        raise ConfigError(f"{source}: {forbidden} are set by the runner (the run is named after the params file)")
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
        raise ConfigError(f"{source}: no notebook declares {unknown_keys(unknown, known)}")
    resolved = {}
    for name, defaults in declared.items():
        values = {**defaults, **{k: v for k, v in overrides.items() if k in defaults}}
        for cls in STAGES[name]:
            fields = cls.__dataclass_fields__
            from_dict(cls, {k: v for k, v in values.items() if k in fields}, f"{source} (notebook {name})")
        resolved[name] = values
    return resolved


def finished(path: Path, parameters: dict[str, Any]) -> bool:
    """Whether an executed notebook completed without error with exactly these parameters."""
    if not path.is_file():
        return False
    import nbformat

    meta = nbformat.read(path, as_version=4).metadata.get("papermill", {})
    return meta.get("exception") is None and meta.get("end_time") is not None and meta.get("parameters") == parameters


class _KnownParameters(logging.Filter):
    """papermill warns about parameters its regex cannot read (`int | None` annotations); `resolve` has
    already checked every key against the notebooks, so that warning is noise here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Passed unknown parameter")


logging.getLogger("papermill").addFilter(_KnownParameters())


def run_pipeline(
    params_file: str | Path,
    only: list[str] | None = None,
    sets: dict[str, Any] | None = None,
    mode: str = "new",
    outputs: str | Path = REPO / "outputs",
    notebook_dir: Path = NOTEBOOK_DIR,
    log=print,
) -> RunDir:
    import papermill

    params_file = Path(params_file)
    given = {**load_params(params_file), **(sets or {})}
    resolved = resolve(given, str(params_file), notebook_dir)
    selected = NOTEBOOKS if not only else [n for n in NOTEBOOKS if any(n.startswith(p) for p in only)]
    if only and len(selected) != len(only):
        raise ConfigError(f"--only {only}: choose among {', '.join(n[:2] for n in NOTEBOOKS)}")
    run = RunDir.create(Path(outputs) / params_file.stem, mode)
    outputs_dir = str(Path(outputs).resolve())
    for values in resolved.values():
        values.update(run=params_file.stem, outputs_dir=outputs_dir)
    run.write_params(given, resolved)
    run.write_manifest(REPO, params_file=str(params_file), status="running", notebooks=selected)
    for name in selected:
        executed = run.root / "notebooks" / f"{name}.ipynb"
        if mode == "resume" and finished(executed, resolved[name]):
            log(f"[{name}] done earlier with the same parameters: kept")
            continue
        log(f"[{name}] running ...")
        start = time.perf_counter()
        try:
            papermill.execute_notebook(
                str(notebook_dir / f"{name}.ipynb"),
                str(executed),
                parameters=resolved[name],
                cwd=str(notebook_dir),
                kernel_name="python3",
                progress_bar=False,
            )
        except papermill.PapermillExecutionError as err:
            run.write_manifest(REPO, status="failed", failed_notebook=name, ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            raise PipelineError(
                f"{name} failed in cell {err.exec_count}: {err.ename}: {err.evalue}\n"
                f"the executed notebook, with the error, is saved at {executed}"
            ) from None
        log(f"[{name}] finished in {time.perf_counter() - start:.0f}s")
    run.write_manifest(REPO, status="finished", ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the C2LLM notebooks in order through papermill.")
    parser.add_argument("params", help="params/<run>.yaml: flat overrides; the run is named after the file")
    parser.add_argument("--only", nargs="+", metavar="NN", help="run only these notebooks, e.g. --only 04 05")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="override single keys")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="keep finished notebooks, run the rest")
    group.add_argument("--overwrite", action="store_true", help="delete the existing run directory first")
    parser.add_argument("--outputs", default=str(REPO / "outputs"), help="where run directories live")
    args = parser.parse_args(argv)
    mode = "resume" if args.resume else "overwrite" if args.overwrite else "new"
    try:
        run = run_pipeline(args.params, args.only, parse_sets(args.set), mode, args.outputs)
    except (ConfigError, FileExistsError, PipelineError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"results: {run.root}  (metrics/, figures/, notebooks/)")
    summary = run.root / "metrics" / "results.md"
    if summary.is_file():
        print(summary.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
