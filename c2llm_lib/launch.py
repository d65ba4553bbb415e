"""Notebook 02 on every GPU of a machine, or of several machines: torchrun from the pipeline (paper section 4.1's
in-batch negatives over the global batch of all processes).

`train_stage(run_dir, model, train, launch)` is notebook 02's one call. With one process (a CPU, one GPU, teaching)
it trains in the kernel with `train.Trainer`. With more (`nproc`, `nnodes`), it starts
`python -m torch.distributed.run ... -m c2llm_lib.train` as a subprocess on the run's prepared rows, shows rank 0's
progress as a bar fed from the step log rank 0 appends (`steps.jsonl`), and, when a rank dies, raises `RankFailed`
naming the rank, with its error text (its exception from torchrun's error file, else the end of its own log).
Either way the checkpoints land in the run's `checkpoints/`, every rank resumes by the in-kernel rules
(`Trainer.resume_latest`: the same training's last complete checkpoint, another training's moved aside; the
world size is part of what must match), and the same `TrainRecord` comes back for `metrics/train.json`.

Several machines use torchrun's static rendezvous at `rdzv_endpoint` (host:port on node 0): node k holds global
ranks k * nproc .. (k + 1) * nproc - 1, so global rank 0, which writes the checkpoints and the step log, is on node
0, where the notebook runs. The other machines run `python -m c2llm_lib.launch PARAMS --node-rank K ...`, which
resolves the same params and starts the same torchrun command, writing nothing in the run directory. Whether there
is a training to join, every machine decides by node 0's rule (`pipeline.training_reason`: its `--resume` keeps a
finished training whatever machines are named), so no machine waits for another that has left. The machines share
the run directory's filesystem (every rank reads the rows; resuming reads the checkpoints).

The launcher's files lie under `logs/02_train/` of the run: the trainer's params, rank 0's step log and summary,
torchrun's output (`torchrun.log`) and each local rank's output and error file (`ranks/`).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError, LaunchConfig, ModelConfig, TrainConfig, from_dict
from .distributed import die_with_parent
from .files import CorruptFile, load_json

LOGS = Path("logs") / "02_train"  # inside the run directory
FLAGS = ("nnodes", "node_rank", "rdzv_endpoint", "nproc")  # notebook 02's keys the launcher takes as --nnodes ...
RENDEZVOUS_TIMEOUT_S = 600  # how long the machines of a multi-machine training wait for each other to start


class RankFailed(RuntimeError):
    """A training process died; the message names its rank and carries its error."""


@dataclass
class TrainRecord:
    """What notebook 02 reports and saves, the same whether it trained here or through torchrun."""

    steps: int
    seconds: float
    metrics: list[dict[str, Any]]  # one entry per optimizer step of this session
    checkpoints: list[str]
    final_checkpoint: str
    checkpoint_steps: list[int]
    data_fingerprint: str
    trainable_parameters: int
    processes: int  # the world size: processes on all machines together
    note: str  # what resuming did
    negatives_used: int  # K: hard negatives per row the loss used (the run's K, at most what any row holds)
    dtype: str  # the dtype the backbone computed in (`dtype: auto` resolved on this machine)

    def summary(self, model: ModelConfig, train: TrainConfig, launch: LaunchConfig) -> dict[str, Any]:
        """`metrics/train.json`: the numbers, the checkpoints notebook 03 merges, and the configs in effect (the model
        config with the dtype the training resolved, as its checkpoints record it; `dtype_asked` is the params')."""
        return {"steps": self.steps, "seconds": self.seconds, "checkpoints": self.checkpoints,
                "final_checkpoint": self.final_checkpoint, "data_fingerprint": self.data_fingerprint,
                "trainable_parameters": self.trainable_parameters, "processes": self.processes,
                "negatives_used": self.negatives_used,
                "model_config": {**model.to_dict(), "dtype": self.dtype}, "dtype_asked": model.dtype,
                "train_config": train.to_dict(), "launch": launch.to_dict(),
                "log": self.metrics}  # fmt: skip


def processes(launch: LaunchConfig, model: ModelConfig) -> int:
    """Training processes on this machine: `nproc`, or for "auto" every visible CUDA GPU (1 without one, or when
    `device` pins one device). A number the device cannot hold is an error naming the key."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() and model.device in ("auto", "cuda") else 0
    if launch.nproc == "auto":
        return max(1, gpus)
    if launch.nproc > 1 and model.device not in ("auto", "cuda", "cpu"):
        raise ConfigError(
            f"parameter 'nproc' = {launch.nproc} needs one device per process, but device = {model.device!r} pins "
            "one; set device: auto (each process takes its own GPU) or cpu"
        )
    if gpus and launch.nproc > gpus:
        raise ConfigError(f"parameter 'nproc' = {launch.nproc} exceeds the {gpus} GPU(s) this machine shows")
    return launch.nproc


def torchrun_command(launch: LaunchConfig, nproc: int, params: Path, rows: Path, out: Path, logs: Path,
                     node_rank: int | None = None) -> list[str]:  # fmt: skip
    """`python -m torch.distributed.run ... -m c2llm_lib.train ...` for this machine: one machine rendezvouses on
    its own (`--standalone`, a free port); several meet at `rdzv_endpoint` (static: node k holds ranks k * nproc
    onwards). Each local rank's output goes to its own file under `logs/ranks`; the trainer resumes as notebook 02
    does (`--resume-latest`) and rank 0 writes its step log and summary into `logs`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    if launch.nnodes == 1:
        cmd.append("--standalone")
    else:
        host, port = launch.rdzv_endpoint.rsplit(":", 1)
        rank = launch.node_rank if node_rank is None else node_rank
        cmd += ["--nnodes", str(launch.nnodes), "--node_rank", str(rank), "--master_addr", host.strip("[]"),
                "--master_port", port, "--rdzv_conf", f"timeout={RENDEZVOUS_TIMEOUT_S}"]  # fmt: skip
    cmd += ["--log_dir", str(logs / "ranks"), "--redirects", "3", "-m", "c2llm_lib.train", "--params", str(params),
            "--rows", str(rows), "--out", str(out), "--resume-latest", "--record-dir", str(logs)]  # fmt: skip
    return cmd


def trainer_params(model: ModelConfig, train: TrainConfig) -> str:
    """The flat YAML `c2llm_lib.train --params` reads: every model and training parameter in effect."""
    return yaml.safe_dump({**model.to_dict(), **train.to_dict()}, sort_keys=True)


# torchrun is started through this trampoline: `distributed.die_with_parent`, its source run here before anything
# imports torch (a start in milliseconds, not the library's seconds), asks Linux for SIGTERM when its parent (the
# notebook's kernel) dies, then the process becomes torchrun (the request survives exec). torchrun passes a SIGTERM
# on to every rank, and each rank asks the same of torchrun: a runner that is killed takes its training with it.
DIES_WITH_PARENT = (
    "import os, signal, sys\n"
    + inspect.getsource(die_with_parent)
    + "die_with_parent(int(sys.argv[1]))  # exits at once where the parent is already gone\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)


def dies_with_this_process(cmd: list[str]) -> list[str]:
    """`cmd` (a `python ...` command) started so that it receives SIGTERM when this process dies."""
    return [cmd[0], "-c", DIES_WITH_PARENT, str(os.getpid()), *cmd[1:]]


def library_env() -> dict[str, str]:
    """The environment for torchrun: this process's, with this copy of c2llm_lib first on the path (the processes
    run the library the notebook imported, not another installed copy)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


# what a failed torchrun leaves: its summary names the ranks, their error files and logs hold the text ---------
FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)[^\n]*\n"
    r"\s*error_file\s*:\s*(?P<file>[^\n]*)"
)


@dataclass
class Failure:
    rank: int
    local_rank: int
    exitcode: int
    error_file: str


def failures(torchrun_output: str) -> list[Failure]:
    """The failed ranks torchrun's summary lists, the root cause (the first to fail) first."""
    root_at = torchrun_output.rfind("Root Cause (first observed failure)")
    found = [(m.start() < root_at, m) for m in FAILURE.finditer(torchrun_output)]
    found.sort(key=lambda item: item[0])  # the root cause (after its heading) first, then the others
    return [Failure(int(m["rank"]), int(m["local"]), int(m["code"]), m["file"].strip()) for _, m in found]


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _rank_log(failure: Failure, ranks_dir: Path) -> Path | None:
    logs = sorted(ranks_dir.glob(f"**/{failure.local_rank}/stderr.log"), key=lambda p: p.stat().st_mtime)
    return logs[-1] if logs else None


def last_sign_of_life(failure: Failure, ranks_dir: Path) -> float:
    """When a failed rank last wrote: its error file, else its own log (a rank that exits without an exception
    prints last). torchrun's root cause goes by whole seconds, so when a rank dies and its peers fail a moment
    later in a collective it may name a peer; this time tells them apart."""
    path = Path(failure.error_file)
    if path.is_file():
        return path.stat().st_mtime
    log = _rank_log(failure, ranks_dir)
    return log.stat().st_mtime if log is not None else float("inf")


def rank_error(failure: Failure, ranks_dir: Path) -> str:
    """A failed rank's error text: the exception its error file records (message, then the traceback's end), else
    the end of its own output (a rank killed or exiting without a Python exception), else ''."""
    path = Path(failure.error_file)
    if path.is_file():
        try:
            message = json.loads(path.read_text()).get("message", {})
        except (OSError, ValueError):
            message = {}
        if isinstance(message, dict) and message.get("message"):
            stack = message.get("extraInfo", {}).get("py_callstack", "")
            return f"{message['message']}\n{_tail(stack, 8)}".strip()
    log = _rank_log(failure, ranks_dir)
    return _tail(log.read_text(errors="replace")) if log is not None else ""


def diagnose(logs: Path, returncode: int, world_size: int) -> str:
    """The message for a failed torchrun: the first rank to fail, its exit code and error text, the other failed
    ranks, and where the logs are."""
    output = (logs / "torchrun.log").read_text(errors="replace") if (logs / "torchrun.log").is_file() else ""
    found = failures(output)
    where = f"logs: {logs / 'torchrun.log'} and each rank's under {logs / 'ranks'}"
    if not found:
        return (f"training failed: torchrun exited with status {returncode} before a rank reported a failure; "
                f"its output ends:\n{_tail(output)}\n({where})")  # fmt: skip
    found.sort(key=lambda f: last_sign_of_life(f, logs / "ranks"))  # stable: torchrun's root cause first on a tie
    root, others = found[0], found[1:]
    error = rank_error(root, logs / "ranks") or "(it left no error text)"
    signal = f", killed by signal {-root.exitcode}" if root.exitcode < 0 else ""
    also = f"; rank(s) {[f.rank for f in others]} failed after it" if others else ""
    return (f"training failed on rank {root.rank} of {world_size} (local rank {root.local_rank}, exit code "
            f"{root.exitcode}{signal}){also}. Rank {root.rank}'s error:\n{error}\n({where}; rerunning notebook 02 "
            "resumes from the last complete checkpoint)")  # fmt: skip


class StepLog:
    """Follows rank 0's `steps.jsonl` as it grows, returning only complete lines."""

    def __init__(self, path: Path):
        self.path, self.offset, self.line = path, 0, 0

    def read(self) -> list[dict[str, Any]]:
        """The entries of the lines completed since the last read; a line that is not a JSON object (two writers, a
        damaged file) is a `CorruptFile` naming the file and line."""
        if not self.path.is_file():
            return []
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]
        entries = []
        for line in complete.decode(errors="replace").splitlines():
            self.line += 1
            try:
                entry = json.loads(line) if line.strip() else None
            except ValueError:
                entry = line
            if entry is not None and not isinstance(entry, dict):
                raise CorruptFile(f"{self.path}, line {self.line}: not a step record ({line[:80]!r}); did two "
                                  "trainings write this run's step log at once?")  # fmt: skip
            if entry is not None:
                entries.append(entry)
        self.offset += len(complete)
        return entries


def run_torchrun(cmd: list[str], logs: Path, world_size: int, log=print, poll_s: float = 0.5) -> None:
    """Runs `cmd` (torchrun), its output into `logs/torchrun.log`, showing rank 0's progress from `logs/steps.jsonl`
    as a bar; a failure raises `RankFailed` (`diagnose`). Interrupting stops every process."""
    from tqdm.auto import tqdm

    steps, bar = StepLog(logs / "steps.jsonl"), None
    with open(logs / "torchrun.log", "w") as output:
        proc = subprocess.Popen(dies_with_this_process(cmd), stdout=output, stderr=subprocess.STDOUT, env=library_env())
        (logs / "torchrun.pid").write_text(f"{proc.pid}\n")
        try:
            while True:
                done = proc.poll() is not None
                for entry in steps.read():
                    if "total_steps" in entry:  # the header: rank 0 resumed (or not) and knows the run's length
                        log(entry["note"])
                        bar = tqdm(total=entry["total_steps"], initial=entry["step"],
                                   desc=f"train ({entry['world_size']} processes)")  # fmt: skip
                    elif bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{entry['loss']:.3f}", data=entry["dataset"][:20])
                if done:
                    break
                time.sleep(poll_s)
        except BaseException:
            proc.terminate()  # torchrun passes it on to every rank
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        finally:
            if bar is not None:
                bar.close()
    if proc.returncode != 0:
        raise RankFailed(diagnose(logs, proc.returncode, world_size))


def train_here(run_dir, model: ModelConfig, train: TrainConfig, log=print) -> TrainRecord:
    """One process, in this kernel: the encoder, the run's rows, `Trainer.resume_latest`, the loop, a final
    checkpoint."""
    import torch

    from .model import C2LLMEncoder
    from .train import Trainer

    torch.manual_seed(train.seed)
    encoder = C2LLMEncoder.from_config(model)
    rows = run_dir.load_dataset("train")
    trainable = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    log(f"{trainable:,} trainable of {sum(p.numel() for p in encoder.parameters()):,} parameters; {len(rows)} rows")
    trainer = Trainer(encoder, rows, train, run_dir.checkpoints_dir)
    note = trainer.resume_latest()  # the same training's last complete checkpoint, or step 0 (another's moved aside)
    log(note)
    result = trainer.train()
    final = trainer.save_final()
    return TrainRecord(result.steps, result.seconds, result.metrics, trainer.checkpoints, final,
                       trainer.checkpoint_steps, trainer.data_fingerprint, trainable, 1, note, trainer.k,
                       trainer.identity()["model_config"]["dtype"])  # fmt: skip


def earlier_torchrun(logs: Path) -> int | None:
    """The pid of this run's earlier torchrun (recorded in `logs/torchrun.pid`) if that process still runs torchrun
    with these logs (Linux's /proc), else None: a second training must not start beside it."""
    try:
        pid = int((logs / "torchrun.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"torch.distributed.run" in cmdline and str(logs).encode() in cmdline else None


def train_processes(run_dir, model: ModelConfig, train: TrainConfig, launch: LaunchConfig, nproc: int,
                    log=print) -> TrainRecord:  # fmt: skip
    """torchrun with `nproc` processes here (and as many on each other machine) on the run's rows and checkpoints;
    the launcher's files go to `logs/02_train/`, emptied first."""
    logs = run_dir.root / LOGS
    alive = earlier_torchrun(logs)
    if alive is not None:
        raise RankFailed(f"an earlier training of run {run_dir.root.name!r} is still running (torchrun, pid {alive}, "
                         f"its logs in {logs}); stop it (kill {alive}) before training again")  # fmt: skip
    if logs.exists():
        shutil.rmtree(logs)
    logs.mkdir(parents=True)
    (logs / "params.yaml").write_text(trainer_params(model, train))
    world_size = nproc * launch.nnodes
    if launch.nnodes > 1:
        check_endpoint(launch.rdzv_endpoint)
    cmd = torchrun_command(launch, nproc, logs / "params.yaml", run_dir.require("data/train"), run_dir.checkpoints_dir,
                           logs)  # fmt: skip
    log(f"{world_size} processes ({nproc} per machine on {launch.nnodes}): {' '.join(cmd)}")
    run_torchrun(cmd, logs, world_size, log)
    summary = load_json(logs / "train_summary.json", "training summary")
    metrics = json.loads((logs / "train_metrics.json").read_text())
    if not isinstance(metrics, list) or len(metrics) != summary["steps"]:
        raise CorruptFile(f"{logs / 'train_metrics.json'}: expected a list of {summary['steps']} step entries")
    return TrainRecord(len(metrics), summary["train_seconds"], metrics, summary["checkpoints"],
                       summary["final_checkpoint"], summary["checkpoint_steps"], summary["data_fingerprint"],
                       summary["trainable_parameters"], world_size, summary["note"],
                       summary["negatives_used"], summary["dtype"])  # fmt: skip


def train_stage(run_dir, model: ModelConfig, train: TrainConfig, launch: LaunchConfig, log=print) -> TrainRecord:
    """Notebook 02's training: in this kernel with one process on one machine, else through torchrun."""
    if launch.node_rank != 0:
        raise ConfigError(
            f"parameter 'node_rank' = {launch.node_rank}: the notebook runs on node 0 only; start the other machines "
            "with `python -m c2llm_lib.launch PARAMS --node-rank K ...` (README: several machines)"
        )
    nproc = processes(launch, model)
    if nproc == 1 and launch.nnodes == 1:
        return train_here(run_dir, model, train, log)
    return train_processes(run_dir, model, train, launch, nproc, log)


# one command per machine --------------------------------------------------------------------------------------
def notebook_configs(params: Path, overlay: str | None, sets: dict[str, Any]):
    """(run name, ModelConfig, TrainConfig, LaunchConfig) of notebook 02 for a params file, as the pipeline
    resolves it."""
    from .pipeline import resolve_run

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


def check_endpoint(endpoint: str, key: str = "rdzv_endpoint") -> None:
    """Refuses, naming `key`, an endpoint whose host does not resolve: torchrun would otherwise wait for it for
    minutes without a word."""
    import socket

    host, port = endpoint.rsplit(":", 1)
    try:
        socket.getaddrinfo(host.strip("[]"), int(port))
    except (OSError, ValueError) as err:
        raise ConfigError(f"{key} {endpoint!r}: the host {host!r} does not resolve on this machine ({err})") from None


def main(argv: list[str] | None = None) -> int:
    """One command for every machine of a multi-machine training (e.g. under srun): node 0 runs notebook 02 through
    the pipeline (the run must hold notebook 01's data), the others start their share of the processes. A bad
    argument or params value is one `error:` line naming it (exit 2); a failed training names its rank (exit 1)."""
    from .pipeline import PipelineError, parse_sets, run_pipeline
    from .runs import RunInUse

    parser = argparse.ArgumentParser(description="Notebook 02 on several machines: run this on each of them.")
    parser.add_argument("params", help="params/<run>.yaml (the run whose notebook 01 has prepared the data)")
    parser.add_argument("--nnodes", type=int, required=True, help="machines")
    parser.add_argument("--node-rank", type=int, required=True, help="this machine's index, 0 .. nnodes - 1")
    parser.add_argument("--rdzv-endpoint", required=True, help="host:port on node 0, e.g. node001:29500")
    parser.add_argument("--nproc", default=None, type=nproc_argument,
                        help="processes per machine (default: the params' nproc, auto)")  # fmt: skip
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE")
    parser.add_argument("--overlay", default=None)
    parser.add_argument("--outputs", default=str(Path(__file__).resolve().parent.parent / "outputs"))
    parser.add_argument("--log-dir", default=None, help="where a machine other than node 0 keeps torchrun's logs")
    args = parser.parse_args(argv)
    try:
        return _launch(args, parse_sets, run_pipeline)
    except (ConfigError, OSError, CorruptFile, RunInUse) as err:  # a missing folder, a log dir that cannot be made
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (RankFailed, PipelineError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def _launch(args: argparse.Namespace, parse_sets, run_pipeline) -> int:
    from .pipeline import training_reason

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
