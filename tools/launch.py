"""One command for every machine of a multi-machine training of notebook 02 (paper section 4.1's global batch over
the processes of several machines), e.g. under srun:

    python -m tools.launch params/<run>.yaml --nnodes N --node-rank K --rdzv-endpoint HOST:PORT [--nproc P]
                           [--set KEY=VALUE ...] [--overlay YAML] [--outputs DIR] [--log-dir DIR]

Node 0 runs notebook 02 through the pipeline (the run must hold notebook 01's data); every other machine resolves
the same params and starts its share of the same torchrun command (`c2llm_lib.train.launch.torchrun_command`), writing
nothing in the run directory, after checking by node 0's rule (`training_reason`) that there is a training
to join. A tool beside the library (no notebook calls it): it imports c2llm_lib, which never imports it. It was
`python -m c2llm_lib.launch`, which now names this command and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Any

from c2llm_lib.checks import ConfigError
from c2llm_lib.config import LaunchConfig, ModelConfig, TrainConfig, from_dict
from c2llm_lib.files import CorruptFile
from c2llm_lib.notebook import NOTEBOOK_DIR
from c2llm_lib.params import parse_sets, resolve_run
from c2llm_lib.pipeline import REPO, PipelineError, check_upstream, run_pipeline, run_root
from c2llm_lib.runs import RunDir, RunInUse
from c2llm_lib.stages import records_of, rerun_reason
from c2llm_lib.train.launch import (
    RENDEZVOUS_TIMEOUT_S,
    RankFailed,
    check_endpoint,
    processes,
    run_torchrun,
    torchrun_command,
    trainer_params,
)

FLAGS = ("nnodes", "node_rank", "rdzv_endpoint", "nproc")  # notebook 02's keys the launcher takes as --nnodes ...
TRAIN = "02_train_lora_contrastive"


def training_reason(
    params_file: str | Path,
    sets: dict[str, Any],
    overlay: str | Path | None,
    outputs: str | Path,
    notebook_dir: Path = NOTEBOOK_DIR,
) -> str:
    """Why node 0's `--resume --only 02` trains (the other machines must join), or '' when it keeps the finished
    training: node 0's parameters through the runner's `check_upstream` and `rerun_reason`."""
    name, _, resolved, selected = resolve_run(params_file, {**sets, "node_rank": 0}, overlay, ["02"], notebook_dir)
    run = RunDir(run_root(outputs, name, resolved))
    check_upstream(run, selected, resolved, str(params_file), notebook_dir)
    return rerun_reason(run, TRAIN, resolved[TRAIN], records_of(run).get(TRAIN, {}), notebook_dir)[0]


def notebook_configs(params: Path, overlay: str | None, sets: dict[str, Any]):
    """(run name, ModelConfig, TrainConfig, LaunchConfig) of notebook 02 for a params file, as the pipeline
    resolves it."""
    flags = {key: f"--{key.replace('_', '-')}" for key in FLAGS if key in sets}  # what the errors blame
    _, _, resolved, _ = resolve_run(params, sets, overlay, set_origins=flags)
    values = resolved["02_train_lora_contrastive"]
    configs = []
    for cls in (ModelConfig, TrainConfig, LaunchConfig):
        names = {f.name for f in dataclasses.fields(cls)}
        configs.append(from_dict(cls, {k: v for k, v in values.items() if k in names}, str(params)))
    return (params.stem, *configs)


def nproc_argument(value: str) -> int | str:
    """`--nproc`: "auto" or a positive number of processes (argparse names the flag in its error)."""
    if value == "auto":
        return value
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number of processes, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive number of processes, got {value!r}")
    return number


def main(argv: list[str] | None = None) -> int:
    """One command for every machine of a multi-machine training (e.g. under srun): node 0 runs notebook 02 through
    the pipeline (the run must hold notebook 01's data), the others start their share of the processes. A bad
    argument or params value is one `error:` line naming it (exit 2); a failed training names its rank (exit 1)."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.launch", description="Notebook 02 on several machines: run this on each of them."
    )
    parser.add_argument("params", help="params/<run>.yaml (the run whose notebook 01 has prepared the data)")
    parser.add_argument("--nnodes", type=int, required=True, help="machines")
    parser.add_argument("--node-rank", type=int, required=True, help="this machine's index, 0 .. nnodes - 1")
    parser.add_argument("--rdzv-endpoint", required=True, help="host:port on node 0, e.g. node001:29500")
    parser.add_argument("--nproc", default=None, type=nproc_argument,
                        help="processes per machine (default: the params' nproc, auto)")  # fmt: skip
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE")
    parser.add_argument("--overlay", default=None)
    parser.add_argument("--outputs", default=str(REPO / "outputs"))
    parser.add_argument("--log-dir", default=None, help="where a machine other than node 0 keeps torchrun's logs")
    args = parser.parse_args(argv)
    try:
        return _launch(args)
    except (ConfigError, OSError, CorruptFile, RunInUse) as err:  # a missing folder, a log dir that cannot be made
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (RankFailed, PipelineError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def _launch(args: argparse.Namespace) -> int:
    sets = {**parse_sets(args.set), **{key: getattr(args, key) for key in FLAGS if getattr(args, key) is not None}}
    params = Path(args.params)
    name, model, train, launch = notebook_configs(params, args.overlay, sets)  # validates every value, naming it
    check_endpoint(launch.rdzv_endpoint, "--rdzv-endpoint")
    if args.node_rank == 0:
        run_pipeline(params, only=["02"], sets={**sets, "node_rank": 0}, mode="resume", outputs=args.outputs,
                     overlay=args.overlay)  # fmt: skip
        return 0
    run = Path(args.outputs) / name
    rows = run / "data" / "train"
    if not rows.is_dir():
        raise FileNotFoundError(f"{rows} is missing: run notebook 01 for run {name!r} first (on a filesystem every "
                                "machine shares)")  # fmt: skip
    if not training_reason(params, sets, args.overlay, args.outputs):  # node 0 decides by the same call
        raise ConfigError(f"the training of run {name!r} with these parameters already finished ({run}/metrics/"
                          "train.json), and node 0 keeps it: nothing for this machine to join. Run notebooks 03-05 on "
                          "one machine, or change the params to train again")  # fmt: skip
    nproc = processes(launch, model)
    logs = Path(args.log_dir or tempfile.mkdtemp(prefix=f"c2llm-{name}-node{args.node_rank}-"))
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "params.yaml").write_text(trainer_params(model, train))
    cmd = torchrun_command(launch, nproc, logs / "params.yaml", rows, run / "checkpoints", logs)
    print(f"node {args.node_rank}: {' '.join(cmd)}", flush=True)
    print(f"node {args.node_rank}: meeting node 0 at {launch.rdzv_endpoint} (torchrun waits up to "
          f"{RENDEZVOUS_TIMEOUT_S} s for it)", flush=True)  # fmt: skip
    run_torchrun(cmd, logs, nproc * launch.nnodes, log=print)
    return 0


if __name__ == "__main__":
    sys.exit(main())
