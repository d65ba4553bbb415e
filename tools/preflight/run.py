"""`run_preflight`: every check of one params file, in the order a run would meet their failures, as a `Report`;
`main`, the report printed and saved beside the run directory; and `cli`, the command that runs them
(`python -m tools.preflight PARAMS ...`, `make preflight PARAMS=...`; exit status 1 when a check fails).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from c2llm_lib.checks import ConfigError
from c2llm_lib.params import parse_sets
from c2llm_lib.pipeline import REPO

from . import device as measure
from .disk import check_disk, check_run_dir, data_needs, model_needs, round_trip_check, scratch_folder
from .environment import environment_checks
from .inputs import (
    Hub,
    check_backbone,
    check_evaluation_data,
    check_local_sets,
    check_own_data,
    check_release,
    check_schedule,
    check_training_sources,
)
from .processes import check_processes
from .report import GROUPS, Check, Limits, Report, save_preflight
from .setup import Setup, backbone_arch, load_setup, row_count, total_steps


def needs_backbone(setup: Setup) -> bool:
    """Whether a notebook the run executes loads the run's backbone (training, merging, attention, comparison, or an
    evaluation of the run's own model)."""
    own_eval = setup.runs("04") and setup.evaluation.eval_released is None
    return any(setup.runs(n) for n in ("02", "03", "05", "06")) or own_eval


def input_checks(setup: Setup, limits: Limits, nproc: int) -> tuple[list[Check], dict[str, Any]]:
    """The inputs group, and what later checks use: the backbone's availability, rows, steps, sizes, tasks, and why
    the schedule refuses the training batch ('' when it does not)."""
    checks, found = [], {"loadable": False, "tasks": [], "sets": None, "source_bytes": None, "groups": {}}
    hub, own, heldout = Hub(limits.hub_timeout_s), None, None
    if setup.runs("01") and setup.data.data_source in ("files", "code"):  # the user's data, never the hub's sources
        check, own, heldout = check_own_data(setup)
        checks.append(check)
        found["source_bytes"] = check.values.get("bytes") or None
    elif setup.runs("01"):
        check, sources = check_training_sources(setup, hub)
        checks.append(check)
        found["source_bytes"] = check.values.get("bytes") or None
        found["groups"] = {k: v for s in sources for k, v in s.groups.items() if k != "sha"}
    evaluation, found["tasks"] = check_evaluation_data(setup, hub)
    checks.append(evaluation)
    local, found["sets"] = check_local_sets(setup, heldout)  # BEIR sets, unseen libraries; notebook 04's task sets
    if local is not None:
        checks.append(local)
    backbone, found["loadable"] = check_backbone(setup, hub)  # the probes measure it (or a stand-in) either way
    if needs_backbone(setup):
        checks.append(backbone)
    release = check_release(setup, hub)
    if release is not None:
        checks.append(release)
    found["rows"] = row_count(setup, found["groups"] or None, own)
    found["steps"] = total_steps(setup.train, found["rows"])
    schedule = check_schedule(setup, found["rows"], found["steps"], nproc)
    found["checkpoints"] = schedule.values.get("checkpoints", 0)
    found["batch_refused"] = schedule.values.get("batch_refused", "")
    checks.append(schedule)
    return checks, found


def not_run(why: str) -> list[Check]:
    """The training measurements' lines when the schedule refuses the batch they would take: not run, and why."""
    message = f"not run: {why} (see inputs/schedule); nothing is measured on a batch the run cannot take"
    lines = (("memory", "largest batch"), ("speed", "training"), ("writes", "checkpoint round trip"))
    return [Check(group, name, "warn", "not run", message, basis="given") for group, name in lines]


def device_checks(setup: Setup, limits: Limits, device, nproc: int, found: dict[str, Any], scratch: Path | None,
                  run_arch) -> tuple[list[Check], dict[str, Any]]:  # fmt: skip
    """Memory, speed, projection and the checkpoint round trip, from the probes; (checks, the probe's figures). Where
    the schedule refuses the training batch, the training measurements are not run (lines saying why), and only the
    evaluation's inference, which takes no training batch, is measured."""
    trains, evaluates = setup.trains, setup.runs("04")
    if not (trains or evaluates):
        return [], {}
    refused = found.get("batch_refused", "") if trains else ""
    skipped = not_run(refused) if refused else []
    measured = trains and not refused
    if not (measured or evaluates):
        projection = Check("speed", "projection", "warn", "not run", skipped[0].message, basis="given")
        return [*skipped, projection], {}
    if device is None:
        return [Check("memory", "largest batch", "fail", "not measured", "no device: see environment/device")], {}
    who = measure.subject(setup, device, found["loadable"], run_arch)
    wanted = (["memory", "speed", "checkpoint"] if measured else []) + (["inference"] if evaluates else [])
    spec = measure.probe_spec(setup, who, nproc, limits, scratch, wanted, device)
    gpus = measure.gpus_for(device, nproc)
    specs = [(dataclasses.replace(spec, search=i == 0), gpu) for i, gpu in enumerate(gpus)]  # one device searches
    results = measure.run_probes(specs, limits.probe_timeout_s, scratch)
    checks, per_step = skipped, None
    if measured:
        checks.append(measure.memory_check(setup, spec, results, who))
        speed, per_step = measure.speed_check(setup, results, who)
        checks.append(speed)
        first = results[0][0]
        error = results[0][1] or (first.error.splitlines()[0] if first is not None and first.error else "")
        checkpoint = first.checkpoint if first is not None else None
        if scratch is None:
            error = "the outputs folder is not writable (writes/outputs folder)"
        checks.append(round_trip_check(checkpoint, error, who.description))
    checks.append(measure.projection_check(setup, results, who, spec, per_step, found["rows"], found["steps"],
                                           found["checkpoints"], found["tasks"], nproc, device,
                                           found["sets"]))  # fmt: skip
    return checks, probe_figures(results[0][0], who, spec)


def probe_figures(first, who: measure.Subject, spec) -> dict[str, Any]:
    """What the disk and processes checks take from the first probe: the checkpoint's size, the dtype, the
    embedding width and trainable parameters (the run's architecture's, computed, where a stand-in was measured)."""
    from ..scale import lora_params, pma_params

    out = {
        "dtype": first.dtype if first else None,
        "texts": spec.rows * (2 + spec.negatives),
        "checkpoint_bytes": None,
        "width": (first.arch or {}).get("hidden", 0) if first else 0,
        "trainable": first.trainable if first else 0,
    }
    if who.stand_in and who.run_arch is not None:
        model = who.model
        out.update(width=who.run_arch.hidden, trainable=lora_params(who.run_arch, model.lora_r, model.lora_targets)
                   + pma_params(who.run_arch.hidden))  # fmt: skip
    elif first is not None:
        out["checkpoint_bytes"] = (first.checkpoint or {}).get("bytes")
    return out


def run_preflight(params_file: str | Path, sets: dict[str, Any] | None = None, overlay: str | Path | None = None,
                  outputs: str | Path = "outputs", only: list[str] | None = None,
                  limits: Limits | None = None) -> Report:  # fmt: skip
    """Every check of a run of `params_file` as the runner would start it, without creating its run directory."""
    limits = limits or Limits()
    tick = time.perf_counter()
    setup = load_setup(params_file, sets, overlay, outputs, only)
    report = Report(setup.name, str(params_file), setup.overlay, setup.sets, setup.notebooks,
                    time.strftime("%Y-%m-%dT%H:%M:%S%z"))  # fmt: skip
    run_arch = backbone_arch(setup.model)
    environment, device, nproc = environment_checks(setup, run_arch)
    report.checks += environment
    report.device = environment[0].values | {"figure": environment[0].figure}
    inputs, found = input_checks(setup, limits, nproc)
    report.checks += inputs
    scratch, writable = scratch_folder(setup)
    report.checks += [writable, check_run_dir(setup)]
    try:
        checks, figures = device_checks(setup, limits, device, nproc, found, scratch, run_arch)
        report.checks += checks
        unknown = [] if run_arch is not None else [f"checkpoints and merged model ({setup.model.backbone}: "
                                                   "architecture unknown)"]  # fmt: skip
        from_hub = setup.data.data_source == "hub" and setup.data.hub_mirror is None
        needs = data_needs(setup, found["source_bytes"], from_hub) if setup.runs("01") else []
        dtype = figures.get("dtype") or setup.model.dtype  # the resolved dtype where a probe ran
        half = dtype in ("bfloat16", "float16") or (dtype == "auto" and getattr(device, "type", "") == "cuda")
        needs += model_needs(setup, run_arch, found["checkpoints"], figures.get("checkpoint_bytes"), half)
        report.checks.append(check_disk(needs, limits, unknown))
        several = nproc * setup.launch.nnodes > 1
        if setup.trains and found["batch_refused"] and several:  # its gathered step takes a share of that batch
            report.checks.append(Check("processes", "ranks", "warn", "not run", f"not run: {found['batch_refused']} "
                                       "(see inputs/schedule)", basis="given"))  # fmt: skip
        elif setup.trains:
            width = figures.get("width") or (run_arch.hidden if run_arch else 0)
            report.checks.append(check_processes(setup, nproc, figures.get("texts", 0), width,
                                                 figures.get("trainable", 0), scratch))  # fmt: skip
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    report.checks.sort(key=lambda c: GROUPS.index(c.group))
    report.seconds = time.perf_counter() - tick
    return report


def main(params: str, only: list[str] | None, sets: dict[str, Any], overlay: str | None, outputs: str,
         limits: Limits) -> int:  # fmt: skip
    """The report printed and saved as `<outputs>/<run>.preflight.json`; 1 on a failure."""
    try:
        report = run_preflight(params, sets, overlay, outputs, only, limits)
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(report.table())
    try:
        path = save_preflight(outputs, report.run, report.to_json())
        print(f"report: {path}")
    except (OSError, FileExistsError) as err:
        print(f"error: the report could not be saved: {err}", file=sys.stderr)
        return 1
    return 1 if report.failed() else 0


def cli(argv: list[str] | None = None) -> int:
    """`python -m tools.preflight PARAMS [--only NN ...] [--set KEY=VALUE ...] [--overlay YAML] [--outputs DIR]
    [--memory-gb GB] [--disk-gb GB] [--steps N]`: the checks of `run_preflight` for the run that `python -m
    c2llm_lib.pipeline` would run with the same PARAMS, --only, --set and --overlay, running no notebook. The
    runner's former `--preflight` (its options `--preflight-memory-gb`, `--preflight-disk-gb`, `--preflight-steps`
    are `--memory-gb`, `--disk-gb`, `--steps` here). A bad limit or --set is one `error:` line (exit 1)."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.preflight",
        description="Check, in minutes, what a run needs (environment, inputs, memory, speed, writes, processes) "
        "without running a notebook; print the report and save it as <outputs>/<run>.preflight.json; exit status 1 "
        "when a check fails.",
    )  # fmt: skip
    parser.add_argument("params", help="params/<run>.yaml: the run to check, as the runner would resolve it")
    parser.add_argument("--only", nargs="+", metavar="NN",
                        help="check only what these notebooks need, e.g. --only 01 02")  # fmt: skip
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                        help="override single keys of the params file (each key once), as the runner does")  # fmt: skip
    parser.add_argument("--overlay", metavar="YAML",
                        help="a file laid over the params file before --set, as the runner does")  # fmt: skip
    parser.add_argument("--outputs", default=str(REPO / "outputs"), help="where run directories live")
    parser.add_argument("--memory-gb", type=float, metavar="GB",
                        help="the most one device (or the host, on a CPU) may hold")  # fmt: skip
    parser.add_argument("--disk-gb", type=float, metavar="GB", help="the most the run may write (a quota)")
    parser.add_argument("--steps", type=int, metavar="N",
                        help="optimizer steps timed after the memory step (default: 2 on a GPU; on a CPU 1, or none "
                        "after a slow memory step, whose own time is used)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        limits = Limits(memory_gb=args.memory_gb, disk_gb=args.disk_gb, steps=args.steps)
        sets = parse_sets(args.set)
    except (ValueError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return main(args.params, args.only, sets, args.overlay, args.outputs, limits)
