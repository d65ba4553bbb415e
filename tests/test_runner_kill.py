"""A runner killed during multi-process training (notebook 02 through torchrun) takes its training with it: after
`kill -9` or SIGTERM no torchrun or rank of the run is left writing into it, SIGTERM leaves the manifest "failed"
naming the signal, and the next runner says that the previous one died and trains again."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LONG = {  # a 2-process training long enough to be killed in the middle (the smoke recipe, many more steps)
    "backbone": "tiny-random-qwen2", "device": "cpu", "dtype": "float32", "pma_heads": 4, "lora_r": 4,
    "lora_alpha": 8, "max_length": 64, "rows_per_group": 16, "num_negatives": 2, "global_batch_size": 4,
    "max_steps": 2000, "epochs": 500, "warmup_steps": 1, "checkpoint_steps": [2], "nproc": 2,
}  # fmt: skip


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line holds `text` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def start(params: Path, outputs: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "c2llm_lib.pipeline", str(params), "--outputs", str(outputs), *extra]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})  # fmt: skip


def wait_for_steps(runner: subprocess.Popen, log: Path, steps: int = 3, timeout: float = 240) -> None:
    """Returns once `log` holds `steps` steps; a runner that ended first fails the test at once with its output."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if log.is_file() and len(log.read_text().splitlines()) > steps:  # a header, then one line per step
            return
        if runner.poll() is not None:
            raise AssertionError(f"the runner ended ({runner.returncode}) before training:\n{runner.stdout.read()}")
        time.sleep(1)
    raise AssertionError(f"{log} did not reach {steps} steps in {timeout}s")


def gone(text: str, timeout: float = 60) -> list[int]:
    """The processes still mentioning `text` after up to `timeout` seconds ([] once they are all gone)."""
    deadline = time.time() + timeout
    while (left := processes_mentioning(text)) and time.time() < deadline:
        time.sleep(0.5)
    return left


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    params = root / "long.yaml"
    params.write_text(json.dumps(LONG))
    done = start(params, root / "outputs", "--only", "01")
    assert done.wait(timeout=600) == 0, done.stdout.read()
    return params, root / "outputs" / "long"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_runner_takes_its_training_processes_with_it(prepared, sig):
    params, run = prepared
    logs = run / "logs" / "02_train"
    (logs / "steps.jsonl").unlink(missing_ok=True)
    # 02 reruns for a new learning rate (not a new seed, which notebook 01 declares too: `--only 02` would refuse it)
    runner = start(params, run.parent, "--only", "02", "--resume", "--set", f"learning_rate={int(sig)}e-4")
    wait_for_steps(runner, logs / "steps.jsonl")
    assert len(processes_mentioning(str(logs))) >= 3  # torchrun and its 2 ranks are running
    runner.send_signal(sig)
    output = runner.communicate(timeout=120)[0]
    assert gone(str(logs)) == []  # no orphan keeps training into the run
    manifest = json.loads((run / "manifest.json").read_text())
    if sig == signal.SIGTERM:
        assert runner.returncode == 1 and "Terminated: the runner received SIGTERM" in output
        assert manifest["status"] == "failed" and "SIGTERM" in manifest["error"]
        assert manifest["notebooks"]["02_train_lora_contrastive"]["status"] == "failed"
        return
    assert manifest["status"] == "running"  # nobody could write it; the next runner reads that as a death
    again = start(params, run.parent, "--only", "02", "--resume", "--set", "max_steps=3")
    output = again.communicate(timeout=600)[0]
    assert again.returncode == 0, output
    assert "the previous runner of this run died while it ran" in output
    assert json.loads((run / "manifest.json").read_text())["status"] == "finished"
