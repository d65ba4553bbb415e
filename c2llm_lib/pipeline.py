"""The pipeline runner: notebooks/01..06 in order through papermill, one run directory per params file.

    python -m c2llm_lib.pipeline params/<run>.yaml [--only 02 03] [--set key=value ...]
                                 [--resume | --overwrite] [--outputs DIR]

A params file holds flat overrides; the run is named after the file, and the name must be a plain
directory name. Before anything runs, the file must hold at least one key and no key twice, every
override must be declared by some notebook's parameters cell (papermill itself only warns), must not be a
derived key (run, outputs_dir), and must validate in the stage dataclasses of every notebook declaring it.
Numbers such as `1e-3` read as floats (plain YAML 1.1 reads them as strings). Each notebook receives
exactly the keys it declares.

A new run refuses an existing run directory. `--resume` keeps a notebook that finished with the same
parameters and the same inputs (a fingerprint of the run files it reads, `runs.INPUTS`), and reruns the
rest. `--overwrite` deletes the old run first; with `--only` it deletes only the products of the chosen
notebooks (`runs.PRODUCTS`) and reruns them, keeping what they read. One runner at a time works in a run
directory (an fcntl lock, released when the runner exits or dies). The first failing notebook stops the
run, a dead kernel (killed, out of memory) included; it is saved executed, with the error, the error is
printed, and manifest.json records per notebook whether it finished, failed, was not reached, or is
stale (finished before its inputs changed), its seconds, and its kernel's peak resident memory (`peak_rss_kib`,
the largest of any process the notebook started, `memory.PeakMemory`).

Each executed notebook, finished or failed, is also saved as HTML beside it (`notebooks/NN_*.html`, nbconvert),
for reading a run without a kernel. The kernels' sockets are encrypted (`kernel_config`), which also keeps
ipykernel's "running over TCP without encryption" warning out of the runner's output.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError, from_dict, unknown_keys
from .files import CorruptFile
from .memory import PeakMemory
from .notebook import NOTEBOOK_DIR, RUN_KEYS, STAGES, read_parameters, stage_keys
from .runs import PRODUCTS, RunDir, RunInUse, check_run_name

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = list(STAGES)


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
        data = read_yaml(path.read_text())
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


def apply_overlay(
    params: dict[str, Any], path: str | Path, notebook_dir: Path = NOTEBOOK_DIR, sets: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`params` with an overlay file laid over it (e.g. params/overlays/rehearsal.yaml): its keys replace the file's,
    and the keys under `where_nonempty:` replace only a list the run has non-empty (in the file or as the notebook's
    default), so that an overlay scales what a recipe asks for without switching on what it does not. The run's
    `--set` values (`sets`, applied after the overlay) take part in that validation, since a params file may need
    one to be valid (params/own-code.yaml's code_roots)."""
    overlay = load_params(path)
    conditional = overlay.pop("where_nonempty", {})
    if not isinstance(conditional, dict):
        raise ConfigError(f"{path}: where_nonempty must be a mapping of parameter names to lists")
    merged = {**params, **overlay}
    resolved = resolve({**merged, **(sets or {})}, str(path), notebook_dir)
    for key, value in conditional.items():
        current = [v[key] for v in resolved.values() if key in v]
        if not current:
            raise ConfigError(f"{path}: where_nonempty names {key!r}, which no notebook declares")
        if any(isinstance(v, list) and v for v in current):
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
    """The kernel manager's settings for papermill's kernels: CurveZMQ keys for the kernel's sockets.

    papermill talks to its kernel over TCP on localhost, and ipykernel (7.x) warns at every kernel start that the
    traffic is not encrypted ("Kernel is running over TCP without encryption"). With `transport_encryption="auto"`
    jupyter_client provisions keys when the kernelspec declares support (ipykernel's does), so the traffic is
    encrypted and the kernel has nothing to warn about; a jupyter_client without the setting gets none (its kernels
    predate the warning)."""
    from jupyter_client import KernelManager
    from traitlets.config import Config

    if "transport_encryption" not in KernelManager.class_trait_names():
        return Config()
    return Config({"KernelManager": {"transport_encryption": "auto"}})


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


def reason_to_rerun(record: dict[str, Any], executed: Path, parameters: dict[str, Any], inputs: dict[str, str]) -> str:
    """Why `--resume` must rerun a notebook; '' when what it produced earlier still stands: the manifest says it
    finished, its executed copy is complete with these parameters, and its inputs have the recorded fingerprints."""
    if not executed.is_file():
        return "it has not run"
    try:
        complete, used = executed_state(executed)
    except (OSError, ValueError) as err:  # nbformat's NotJSONError is a ValueError
        return f"its executed copy is unreadable ({type(err).__name__})"
    if record.get("status") not in ("finished", "stale") or not complete:  # stale: its inputs say why, below
        return f"it did not finish (status {record.get('status', 'unknown')!r})"
    if used != parameters:
        changed = sorted(k for k in set(parameters) | set(used or {}) if (used or {}).get(k) != parameters.get(k))
        return f"its parameters changed: {', '.join(changed)}"
    recorded = record.get("inputs")
    if recorded is None:
        return "its inputs were not recorded"
    changed = sorted(k for k in set(inputs) | set(recorded) if inputs.get(k) != recorded.get(k))
    return f"its inputs changed since it ran: {', '.join(changed)}" if changed else ""


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
    name = check_run_name(params_file.stem, f"{params_file}: the run name (the file's stem)")
    given = load_params(params_file)
    if overlay is not None:
        given = apply_overlay(given, overlay, notebook_dir, sets)
    given = {**given, **(sets or {})}
    resolved = resolve(given, str(params_file), notebook_dir)
    selected = NOTEBOOKS if not only else [n for n in NOTEBOOKS if any(n.startswith(p) for p in only)]
    if only and len(selected) != len(only):
        raise ConfigError(f"--only {only}: choose among {', '.join(n[:2] for n in NOTEBOOKS)}")
    # --overwrite --only NN replaces only NN's products; the files it reads stay
    replace = [p for n in selected for p in (*PRODUCTS[n], f"notebooks/{n}.*")] if only else None  # .ipynb, .html
    run = RunDir.create(Path(outputs) / name, mode, replace=replace)
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

    outputs_dir = str(run.root.parent.resolve())
    for values in resolved.values():
        values.update(run=run.root.name, outputs_dir=outputs_dir)
    previous = run.read_manifest()
    records = previous.get("notebooks")
    records = dict(records) if isinstance(records, dict) else {}  # {notebook: {status, inputs, ...}}
    if previous.get("status") == "running":  # this runner holds the lock, so the one that wrote this is gone
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
        executed = run.root / "notebooks" / f"{name}.ipynb"
        inputs = run.input_fingerprints(name)
        reason = reason_to_rerun(earlier.get(name, {}), executed, resolved[name], inputs) if resume else ""
        if resume and not reason:
            records[name] = {**earlier[name], "status": "finished"}
            log(f"[{name}] done earlier with the same parameters and inputs: kept")
            continue
        log(f"[{name}] running" + (f" ({reason})" if reason else "") + " ...")
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
                             peak_rss_kib=peak.kib)  # fmt: skip
        save()
        memory = f", peak resident memory {peak.kib / 2**20:.2f} GiB" if peak.kib else ""
        log(f"[{name}] finished in {time.perf_counter() - start:.0f}s{memory}")
    for name, record in records.items():  # earlier results whose inputs changed since (e.g. after --only 02)
        if name not in selected and record.get("status") == "finished":
            if record.get("inputs") != run.input_fingerprints(name):
                records[name] = {**record, "status": "stale"}
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
    parser.add_argument("--outputs", default=str(REPO / "outputs"), help="where run directories live")
    parser.add_argument(
        "--overlay", metavar="YAML",
        help="a file laid over the params file before --set, e.g. params/overlays/rehearsal.yaml (the recipe on a CPU "
        "with no hub, sizes scaled down)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    mode = "resume" if args.resume else "overwrite" if args.overwrite else "new"
    try:
        run = run_pipeline(args.params, args.only, parse_sets(args.set), mode, args.outputs, overlay=args.overlay)
    except (ConfigError, FileExistsError, PipelineError, RunInUse, CorruptFile) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"results: {run.root}  (metrics/, figures/, notebooks/)")
    summary = run.root / "metrics" / "results.md"
    if summary.is_file():
        print(summary.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
