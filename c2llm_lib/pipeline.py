"""The pipeline runner: notebooks/01..07 run through papermill into one run directory, each recorded in its manifest.

    python -m c2llm_lib.pipeline params/<run>.yaml [--only 02 03] [--set key=value ...] [--resume | --overwrite]

Its rules are written once in docs/runner.md.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .checks import ConfigError
from .files import CorruptFile
from .hardware import PeakMemory
from .notebook import NOTEBOOK_DIR
from .params import NOTEBOOKS, parse_sets, resolve_run
from .runs import OUTSIDE_INPUTS, PRODUCTS, RunDir, RunInUse, upstream
from .stages import check_outside_paths, input_fingerprints, not_current, records_of, rerun_reason, unread

REPO = Path(__file__).resolve().parent.parent
PREFLIGHT = "python -m tools.preflight PARAMS [--only ...] [--set ...] [--overlay ...]"  # make preflight
RESULTS = "04_eval_mteb_code"  # writes metrics/results.md, the table `main` prints


class PipelineError(RuntimeError):
    """A notebook failed; the message names it and where its executed copy is."""


class Terminated(Exception):
    """The runner received SIGTERM: the running notebook fails, its kernel and any training stop."""


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
    """With --only, a chosen notebook would read the products of a notebook that is not current."""


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
    """The settings of papermill's kernels: encrypted sockets (no ipykernel warning), and a log filter that drops the
    "KeyboardInterrupt caught in kernel." line jupyter_client's interrupt-before-shutdown leaves after a successful run
    (an interrupted cell is still the cell's error, and every other kernel error is logged)."""
    from jupyter_client import KernelManager
    from traitlets.config import Config

    quiet = ("--IPKernelApp.exec_lines=get_ipython().kernel.log.addFilter("
             "lambda record: not record.getMessage().startswith('KeyboardInterrupt caught in kernel'))")  # fmt: skip
    config = Config({"NotebookClient": {"extra_arguments": [quiet]}})
    if "transport_encryption" in KernelManager.class_trait_names():
        config.KernelManager.transport_encryption = "auto"
    return config


def _save_html(run: RunDir, name: str, executed: Path, log) -> None:
    """Saves notebooks/<name>.html beside the executed notebook (nbconvert's lab template, figures inline); a failed
    export is logged, never raised."""
    if not executed.is_file():
        return
    try:
        import nbformat
        from nbconvert import HTMLExporter

        run.save_notebook_html(name, HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))[0])
    except Exception as err:  # an exporter or template problem must not hide the notebook's result
        log(f"[{name}] no HTML copy: {type(err).__name__}: {err}")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def check_upstream(
    run: RunDir, selected: list[str], resolved: dict[str, dict[str, Any]], params_file: str, notebook_dir: Path
) -> None:
    """Refuses (`UpstreamNotCurrent`) a chosen notebook reading a product of an unchosen one not current."""
    records, seen = records_of(run), {}
    for name in selected:
        outside = {relative: producer for relative, producer in upstream(name).items() if producer not in selected}
        present = run.input_fingerprints(name) if outside else {}
        for relative, producer in outside.items():
            if unread(relative, present, records.get(producer, {})):
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


def run_root(outputs: str | Path, name: str, resolved: dict[str, dict[str, Any]]) -> Path:
    """The run directory `<outputs>/<name>`, its place given to every notebook (`RUN_KEYS`, in `resolved`)."""
    root = Path(outputs) / name
    for values in resolved.values():
        values.update(run=name, outputs_dir=str(root.parent.resolve()))
    return root


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
    root = run_root(outputs, name, resolved)
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

    records = records_of(run)  # {notebook: {status, inputs, ...}}
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
    """metrics/results.md when notebook 04 is current in the run's manifest, else a line saying why it is stale; ''
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
    """The `python -m tools.preflight` command equivalent to the runner's former `--preflight` with these arguments."""
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
