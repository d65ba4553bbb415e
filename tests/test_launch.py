"""Notebook 02 on several processes: the launch parameters, the torchrun command, how a dead rank is reported, and
(slow) the pipeline with nproc: 2 on CPU (gloo) through notebooks 01-03 equal to one process, and a dead rank
failing the notebook with its rank and error."""

import json
import os
import runpy
import time
import warnings
from pathlib import Path

import pytest
import torch

from c2llm_lib.checks import ConfigError
from c2llm_lib.config import LaunchConfig, ModelConfig
from c2llm_lib.files import load_tensors
from c2llm_lib.params import resolve
from c2llm_lib.pipeline import PipelineError, run_pipeline
from c2llm_lib.train import split_params
from c2llm_lib.train.launch import diagnose, failures, processes, torchrun_command

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "params" / "smoke.yaml"
FAULTS = Path(__file__).resolve().parent / "faults"  # a sitecustomize that makes a chosen rank fail


@pytest.mark.parametrize(
    "values,message",
    [
        ({"nproc": 0}, "'nproc' must be 'auto' or a number of processes from 1 to 1024, got 0"),
        ({"nproc": "8"}, "'nproc' must be int or one of 'auto'"),
        ({"nnodes": 2}, "'rdzv_endpoint' is needed with nnodes = 2"),
        ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "n:1"}, r"'node_rank' must be in \[0, nnodes = 2\), got 2"),
        ({"rdzv_endpoint": "node001"}, "'rdzv_endpoint' must be host:port"),
        ({"rdzv_endpoint": "node001:70000"}, "'rdzv_endpoint' must be host:port"),
    ],
)
def test_bad_launch_values_are_named(values, message):
    with pytest.raises(ConfigError, match=message):
        LaunchConfig(**values)
    with pytest.raises(ConfigError, match=r"p.yaml \(notebook 02_train_lora_contrastive\): parameter"):
        resolve(values, "p.yaml")  # the pipeline refuses them before any notebook runs


def test_launch_keys_are_notebook_02s_and_no_part_of_the_training():
    resolved = resolve({"nproc": 2}, "p.yaml")["02_train_lora_contrastive"]
    assert (resolved["nproc"], resolved["nnodes"], resolved["node_rank"], resolved["rdzv_endpoint"]) == (2, 1, 0, None)
    keys = {k: v for k, v in resolved.items() if k not in ("run", "outputs_dir")}
    model, train = split_params(keys, "p.yaml")  # accepted, and not in the configs a checkpoint must match
    assert "nproc" not in train.to_dict() and "nproc" not in model.to_dict()
    with pytest.raises(ConfigError, match="'nproc'"):
        split_params({**keys, "nproc": -1}, "p.yaml")


def test_processes():
    cpu, gpus = ModelConfig(device="cpu"), torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert processes(LaunchConfig(), cpu) == 1  # auto on a CPU
    assert processes(LaunchConfig(), ModelConfig(device="auto")) == max(1, gpus)  # auto: every visible GPU
    assert processes(LaunchConfig(nproc=2), cpu) == 2  # gloo processes on a CPU
    with pytest.raises(ConfigError, match=r"'nproc' = 2 needs one device per process, but device = 'cuda:1'"):
        processes(LaunchConfig(nproc=2), ModelConfig(device="cuda:1"))


def test_torchrun_commands(tmp_path):
    one = torchrun_command(LaunchConfig(nproc=8), 8, tmp_path / "p.yaml", tmp_path / "rows", tmp_path / "ck", tmp_path)
    assert one[1:6] == ["-m", "torch.distributed.run", "--nproc_per_node", "8", "--standalone"]
    assert one[one.index("-m", 2) :][:2] == ["-m", "c2llm_lib.train"] and "--resume-latest" in one
    two = LaunchConfig(nproc=8, nnodes=2, node_rank=0, rdzv_endpoint="node001:29500")
    cmd = torchrun_command(two, 8, tmp_path / "p.yaml", tmp_path / "rows", tmp_path / "ck", tmp_path, node_rank=1)
    flags = " ".join(cmd)
    assert "--nnodes 2 --node_rank 1 --master_addr node001 --master_port 29500" in flags and "--standalone" not in cmd


SUMMARY = """[W] something
============================================================
c2llm_lib.train FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-01-01_00:00:07
  host      : node001
  rank      : {other} (local_rank: {other})
  exitcode  : 1 (pid: 11)
  error_file: {other_file}
  traceback : RuntimeError: Connection reset by peer
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_00:00:07
  host      : node001
  rank      : {root} (local_rank: {root})
  exitcode  : {code} (pid: 10) {signal}
  error_file: {root_file}
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def _error_file(path: Path, message: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"message": {"message": message, "extraInfo": {"py_callstack": f"Traceback ...\n{message}"}}}
    path.write_text(json.dumps(payload))
    return str(path)


def test_a_dead_rank_is_named_with_its_error(tmp_path):
    ranks = tmp_path / "ranks" / "run-id" / "attempt_0"
    # rank 1 exited without an exception (os._exit, a kill): its own log holds its last words
    (ranks / "1").mkdir(parents=True)
    (ranks / "1" / "stderr.log").write_text("loading...\nrank 1: out of host memory while tokenizing\n")
    time.sleep(0.05)
    peer = _error_file(ranks / "0" / "error.json", "RuntimeError: Connection reset by peer")  # rank 0, afterwards
    output = SUMMARY.format(other=0, other_file=peer, root=1, code=-9, signal="(SIGKILL)", root_file="<N/A>")
    (tmp_path / "torchrun.log").write_text(output)
    assert [(f.rank, f.exitcode) for f in failures(output)] == [(1, -9), (0, 1)]  # the root cause first
    message = diagnose(tmp_path, -9, 2)
    assert message.startswith("training failed on rank 1 of 2 (local rank 1, exit code -9, killed by signal 9)")
    assert "out of host memory while tokenizing" in message and "rank(s) [0] failed after it" in message


def test_the_rank_that_failed_first_is_named_when_torchrun_ties(tmp_path):
    """torchrun's root cause goes by whole seconds: when rank 1 raises and rank 0 fails a moment later in the
    collective it was waiting in, torchrun may name rank 0. The error files' times name rank 1."""
    ranks = tmp_path / "ranks" / "run-id" / "attempt_0"
    first = _error_file(ranks / "1" / "error.json", "ValueError: a bad row in rank 1's slice")
    time.sleep(0.05)
    peer = _error_file(ranks / "0" / "error.json", "RuntimeError: Connection reset by peer")
    output = SUMMARY.format(other=1, other_file=first, root=0, code=1, signal="", root_file=peer)
    (tmp_path / "torchrun.log").write_text(output)
    message = diagnose(tmp_path, 1, 2)
    assert message.startswith("training failed on rank 1 of 2") and "ValueError: a bad row in rank 1's slice" in message


def test_torchrun_failing_before_any_rank_is_reported(tmp_path):
    (tmp_path / "torchrun.log").write_text("usage: torchrun ...\nrun.py: error: unrecognized arguments: --bogus\n")
    message = diagnose(tmp_path, 2, 2)
    assert "torchrun exited with status 2 before a rank reported a failure" in message and "--bogus" in message


# the pipeline: notebooks 01-03 with one process, then 02-03 with two ----------------------------------------
def trained_tensors(run_root: Path) -> dict[str, torch.Tensor]:
    """The last checkpoint's adapter and PMA head, and the merged model's tensors."""
    steps = sorted((run_root / "checkpoints").glob("step-*"))
    out = {f"adapter.{k}": v for k, v in load_tensors(steps[-1] / "adapter" / "adapter_model.safetensors", "a").items()}
    out |= {f"pooler.{k}": v for k, v in load_tensors(steps[-1] / "pooler.safetensors", "pooler").items()}
    for path in sorted((run_root / "merged").rglob("*.safetensors")):
        out |= {f"merged/{path.name}.{k}": v for k, v in load_tensors(path, "merged").items()}
    return out


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    outputs = tmp_path_factory.mktemp("outputs")
    run = run_pipeline(SMOKE, only=["01", "02", "03"], sets={"nproc": 1}, outputs=outputs, log=lambda *_: None)
    return run, trained_tensors(run.root)


@pytest.mark.slow
def test_two_processes_through_the_notebooks_equal_one(one_process):
    run, single = one_process
    assert not (run.root / "logs").exists()  # one process trained in the kernel
    # where notebook 02 runs does not make a finished training stale (--resume would keep it): the one-process
    # training is taken as stopped (its runner killed, say) and continues on two processes
    manifest = json.loads((run.root / "manifest.json").read_text())
    manifest["notebooks"]["02_train_lora_contrastive"]["status"] = "failed"
    (run.root / "manifest.json").write_text(json.dumps(manifest))
    run_pipeline(SMOKE, only=["02", "03"], sets={"nproc": 2}, mode="resume", outputs=run.root.parent,
                 log=lambda *_: None)  # fmt: skip
    record = json.loads((run.root / "metrics" / "train.json").read_text())
    assert record["processes"] == 2 and record["launch"]["nproc"] == 2 and [m["step"] for m in record["log"]] == [
        1, 2, 3, 4]  # fmt: skip
    assert [Path(c).name for c in record["checkpoints"]] == ["step-000002", "step-000003", "step-000004"]
    executed = (run.root / "notebooks" / "02_train_lora_contrastive.ipynb").read_text()
    assert "train (2 processes)" in executed  # rank 0's progress, shown in the notebook
    assert "world size: 1 in the checkpoint, 2 here" in executed  # the one-process checkpoints were moved aside
    assert list(run.root.glob("checkpoints.replaced-*"))
    two = trained_tensors(run.root)
    assert two.keys() == single.keys() and any(k.startswith("merged/") for k in two)
    # fc_k's bias adds the same number to every key score of a head, which the softmax cancels: its true gradient
    # is 0, and Adam turns the rounding noise into lr-sized steps (tests/test_train.py). It cannot change an output.
    for name, value in single.items():
        if "fc_k.bias" not in name:
            torch.testing.assert_close(two[name], value, rtol=1e-4, atol=3e-5, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("mode,error", [("raise", "RuntimeError: injected fault on rank 1 after step 1"),
                                        ("exit", "rank 1: injected fault, exiting with status 3")])  # fmt: skip
def test_a_dead_rank_fails_the_notebook_with_its_error(one_process, monkeypatch, mode, error):
    run, _ = one_process
    monkeypatch.setenv("C2LLM_FAULT_RANK", "1")  # read by tests/faults/sitecustomize.py in every rank
    monkeypatch.setenv("C2LLM_FAULT", mode)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FAULTS), os.environ.get("PYTHONPATH")])))
    with pytest.raises(PipelineError) as failed:
        # 02 reruns: its learning rate changed (not the seed, which notebook 01 declares too: its data would be stale)
        rate = 2e-3 if mode == "raise" else 3e-3
        run_pipeline(SMOKE, only=["02"], sets={"nproc": 2, "learning_rate": rate}, mode="resume",
                     outputs=run.root.parent, log=lambda *_: None)  # fmt: skip
    message = str(failed.value)
    assert "02_train_lora_contrastive failed in cell" in message and "RankFailed" in message
    assert "training failed on rank 1 of 2" in message and error in message


def test_a_garbled_step_log_line_is_named(tmp_path):
    from c2llm_lib.files import CorruptFile
    from c2llm_lib.train.launch import StepLog

    log = tmp_path / "steps.jsonl"
    log.write_text('{"total_steps": 4, "step": 0, "world_size": 2, "note": ""}\n{"step": 1, "loss": 2.0}\n')
    steps = StepLog(log)
    assert [e.get("step") for e in steps.read()] == [0, 1]
    with log.open("a") as fh:  # two writers interleaved
        fh.write('{"step": 2, "lo{"step": 2, "loss": 1.9}\n')
    with pytest.raises(CorruptFile, match=r"steps.jsonl, line 3: not a step record"):
        steps.read()


def test_a_second_training_is_refused_while_an_earlier_torchrun_of_the_run_lives(tmp_path):
    import subprocess
    import sys

    from c2llm_lib.runs import RunDir
    from c2llm_lib.train.launch import RankFailed, earlier_torchrun, train_processes

    run = RunDir.open("r", tmp_path)
    logs = run.root / "logs" / "02_train"
    logs.mkdir(parents=True)
    assert earlier_torchrun(logs) is None  # no pid file
    # a process whose command line reads like this run's torchrun (argv: torch.distributed.run ... --log_dir LOGS)
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "torch.distributed.run", str(logs)])
    try:
        (logs / "torchrun.pid").write_text(f"{fake.pid}\n")
        for _ in range(100):  # until the child has exec'd (before, /proc shows the parent's command line)
            if b"torch.distributed.run" in Path(f"/proc/{fake.pid}/cmdline").read_bytes():
                break
            time.sleep(0.05)
        assert earlier_torchrun(logs) == fake.pid
        with pytest.raises(RankFailed, match=rf"still running \(torchrun, pid {fake.pid}"):
            train_processes(run, ModelConfig(device="cpu"), None, LaunchConfig(nproc=2), 2)
        assert (logs / "torchrun.pid").is_file()  # its logs are left alone
    finally:
        fake.kill()
        fake.wait()
    assert earlier_torchrun(logs) is None  # a dead pid (or a reused one running something else) is no training


def test_the_launch_cli_names_a_bad_argument_without_a_traceback(tmp_path, capsys):
    from tools.launch import main

    with pytest.raises(SystemExit) as exit_:
        main([str(SMOKE), "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "localhost:29500", "--nproc", "abc"])
    assert exit_.value.code == 2 and "argument --nproc: expected 'auto' or a number of processes, got 'abc'" in (
        capsys.readouterr().err)  # fmt: skip
    code = main([str(SMOKE), "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "no-such-host.invalid:29500",
                 "--outputs", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "error: --rdzv-endpoint 'no-such-host.invalid:29500': the host" in err
    assert "does not resolve" in err and "Traceback" not in err
    code = main([str(SMOKE), "--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "localhost:29500"])
    err = capsys.readouterr().err  # the flag is blamed, not the params file
    assert code == 2 and "error: --node-rank (notebook 02_train_lora_contrastive): parameter 'node_rank'" in err
    assert "must be in [0, nnodes = 2), got 2" in err


@pytest.mark.slow
def test_a_machine_started_again_after_the_training_finished_is_refused(one_process, capsys):
    from tools.launch import main

    run, _ = one_process
    # the smoke training finished here, whatever the tests before left (a failed rerun of 02 removes train.json):
    # without it this machine would wait for a node 0 that never comes
    run_pipeline(SMOKE, only=["02"], sets={"nproc": 1}, mode="resume", outputs=run.root.parent, log=lambda *_: None)
    assert json.loads((run.root / "manifest.json").read_text())["notebooks"]["02_train_lora_contrastive"]["status"] == (
        "finished")  # fmt: skip
    code = main([str(SMOKE), "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "localhost:29511",
                 "--outputs", str(run.root.parent)])  # fmt: skip
    err = capsys.readouterr().err  # node 0's --resume keeps the training too (`tools.launch.training_reason`)
    assert code == 2 and "with these parameters already finished" in err and "nothing for this machine to join" in err
    code = main(
        [
            str(SMOKE),
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--rdzv-endpoint",
            "localhost:29511",
            "--outputs",
            str(run.root.parent),
            "--set",
            "learning_rate=0.002",
            "--log-dir",
            "/dev/null/x",
        ]
    )
    err = capsys.readouterr().err  # another training is not refused as done: it gets as far as its log folder
    assert code == 2 and "already finished" not in err and "/dev/null/x" in err


def test_the_former_launch_command_names_its_replacement(capsys):
    """`python -m c2llm_lib.launch` was the command for the other machines; it is `python -m tools.launch` now."""
    with warnings.catch_warnings(), pytest.raises(SystemExit) as exit_:
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is imported already
        runpy.run_module("c2llm_lib.launch", run_name="__main__")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "python -m tools.launch PARAMS --nnodes N --node-rank K" in err
