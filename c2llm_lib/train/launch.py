"""The one launcher of a training (paper section 4.1): `train_stage` (notebook 02) trains in this kernel with one
process, through torchrun with more; `train_in_subprocess` (notebook 06).
docs/training.md#several-gpus-and-several-machines.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..checks import ConfigError
from ..config import LaunchConfig, ModelConfig, TrainConfig
from ..distributed import die_with_parent
from ..files import CorruptFile, load_json
from ..model import C2LLMEncoder
from .loop import Trainer

REPO = Path(__file__).resolve().parent.parent.parent  # where `python -m c2llm_lib.train` finds this library
LOGS = Path("logs") / "02_train"  # inside the run directory
RENDEZVOUS_TIMEOUT_S = 600  # how long the machines of a multi-machine training wait for each other to start
# what the other machines run (docs/training.md, several machines)
MACHINE_COMMAND = "python -m tools.launch PARAMS --nnodes N --node-rank K --rdzv-endpoint HOST:PORT [--nproc P]"


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
        """`metrics/train.json`: the numbers, the checkpoints notebook 03 merges, and the configs in effect."""
        return {"steps": self.steps, "seconds": self.seconds, "checkpoints": self.checkpoints,
                "final_checkpoint": self.final_checkpoint, "data_fingerprint": self.data_fingerprint,
                "trainable_parameters": self.trainable_parameters, "processes": self.processes,
                "negatives_used": self.negatives_used,
                "model_config": {**model.to_dict(), "dtype": self.dtype}, "dtype_asked": model.dtype,
                "train_config": train.to_dict(), "launch": launch.to_dict(),
                "log": self.metrics}  # fmt: skip


def train_stage(run_dir, model: ModelConfig, train: TrainConfig, launch: LaunchConfig, log=print) -> TrainRecord:
    """Notebook 02's training: in this kernel with one process on one machine, else through torchrun."""
    if launch.node_rank != 0:
        raise ConfigError(
            f"parameter 'node_rank' = {launch.node_rank}: the notebook runs on node 0 only; start the other machines "
            f"with `{MACHINE_COMMAND}` (docs/training.md, several machines)"
        )
    nproc = processes(launch, model)
    if nproc == 1 and launch.nnodes == 1:
        return train_here(run_dir, model, train, log)
    return train_processes(run_dir, model, train, launch, nproc, log)


def train_here(run_dir, model: ModelConfig, train: TrainConfig, log=print) -> TrainRecord:
    """One process, in this kernel: the encoder, the rows, `Trainer.resume_latest`, the loop, a final checkpoint."""
    import torch

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


# torchrun: several processes, on this machine or several -------------------------------------------------
def processes(launch: LaunchConfig, model: ModelConfig) -> int:
    """Training processes here: `nproc`, or for "auto" every visible CUDA GPU (1 without one)."""
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
    """`python -m torch.distributed.run ... -m c2llm_lib.train ...` for this machine."""
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
    env = dict(os.environ)
    root = str(REPO)
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
    """When a failed rank last wrote: tells the first to fail from peers failing in the same second."""
    path = Path(failure.error_file)
    if path.is_file():
        return path.stat().st_mtime
    log = _rank_log(failure, ranks_dir)
    return log.stat().st_mtime if log is not None else float("inf")


def rank_error(failure: Failure, ranks_dir: Path) -> str:
    """A failed rank's error text: its error file's exception, else the end of its output, else ''."""
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
    """The message for a failed torchrun: the first rank to fail, its exit code and error, the others, the logs."""
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
        """Entries of the lines completed since the last read; a line that is not a JSON object is a `CorruptFile`."""
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
    """Runs `cmd` (torchrun) into `logs/torchrun.log` with rank 0's progress; a failure raises `RankFailed`."""
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


def earlier_torchrun(logs: Path) -> int | None:
    """The pid of this run's earlier torchrun (`logs/torchrun.pid`) while it still runs with these logs, else None."""
    try:
        pid = int((logs / "torchrun.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"torch.distributed.run" in cmdline and str(logs).encode() in cmdline else None


def train_processes(run_dir, model: ModelConfig, train: TrainConfig, launch: LaunchConfig, nproc: int,
                    log=print) -> TrainRecord:  # fmt: skip
    """torchrun with `nproc` processes here; its files go to `logs/02_train/`, emptied first."""
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


def check_endpoint(endpoint: str, key: str = "rdzv_endpoint") -> None:
    """Refuses, naming `key`, an endpoint whose host does not resolve (torchrun would wait silently)."""
    import socket

    host, port = endpoint.rsplit(":", 1)
    try:
        socket.getaddrinfo(host.strip("[]"), int(port))
    except (OSError, ValueError) as err:
        raise ConfigError(f"{key} {endpoint!r}: the host {host!r} does not resolve on this machine ({err})") from None


# a training in a process of its own (notebook 06's studies) -------------------------------------------------------
def train_in_subprocess(model: ModelConfig, train: TrainConfig, rows_dir: Path, folder: Path, log=print) -> None:
    """Trains in a process of its own that dies with this one, its files under `folder`; a failure raises its error."""
    params = folder / "params.yaml"
    params.write_text(trainer_params(model, train))
    command = [sys.executable, "-m", "c2llm_lib.train", "--params", str(params), "--rows", str(rows_dir),
               "--out", str(folder / "checkpoints")]  # fmt: skip
    log_file = folder / "train.log"
    log(f"training in {folder} (follow it: tail -f {log_file})")
    with open(log_file, "w") as out:  # streamed, so a long training can be followed; it dies with this process
        done = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True,
                              preexec_fn=functools.partial(die_with_parent, os.getpid()))  # fmt: skip
    if done.returncode != 0:
        lines = [line for line in log_file.read_text().splitlines() if line.strip()] or ["(no output)"]
        raise RuntimeError(f"training failed (exit {done.returncode}): {lines[-1]}\n"
                           f"command: {' '.join(command)}\nfull log: {log_file}")  # fmt: skip
