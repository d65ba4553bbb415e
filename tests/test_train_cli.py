"""The torchrun entry point: 2 processes on CPU (gloo) train from a params file and a prepared dataset."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from c2llm_lib.checks import ConfigError
from c2llm_lib.train import encoder_from_checkpoint, split_params

from training_rows import make_rows

PARAMS = {
    "backbone": "tiny-random-qwen2", "device": "cpu", "dtype": "float32", "use_lora": True, "lora_r": 4,
    "lora_alpha": 8, "pma_heads": 4, "global_batch_size": 4, "num_negatives": 2, "max_steps": 3,
    "checkpoint_steps": [2], "max_length": 64,
}  # fmt: skip


def test_params_split_and_unknown_keys():
    model, train = split_params(PARAMS, "p.yaml")
    assert model.lora_r == 4 and train.max_steps == 3
    with pytest.raises(ConfigError, match=r"p.yaml: unknown parameter\(s\) \['learning_rat'\]"):
        split_params({**PARAMS, "learning_rat": 1e-4}, "p.yaml")


def test_torchrun_two_processes(tmp_path):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(PARAMS))
    make_rows().save_to_disk(str(tmp_path / "rows"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           "-m", "c2llm_lib.train", "--params", str(tmp_path / "p.yaml"), "--rows", str(tmp_path / "rows"),
           "--out", str(tmp_path / "ckpt")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained 3 steps on 2 process(es)" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.is_dir()) == ["step-000002", "step-000003"]
    metrics = json.loads((tmp_path / "ckpt" / "train_metrics.json").read_text())
    assert [m["step"] for m in metrics] == [1, 2, 3]
    summary = json.loads((tmp_path / "ckpt" / "train_summary.json").read_text())
    assert summary["steps"] == 3 and summary["tokens"] == sum(m["tokens"] for m in metrics) > 0
    assert summary["tokens_per_second"] == pytest.approx(summary["tokens"] / summary["seconds"])
    assert 0 < summary["train_peak_rss_gb"] <= summary["peak_rss_gb"]  # the training window, after loading
    assert summary["final_checkpoint"].endswith("step-000003")
    encoder_from_checkpoint(tmp_path / "ckpt" / "step-000003", device="cpu")
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert again.returncode != 0 and "already holds checkpoints" in again.stderr


def test_ranks_that_resolve_dtype_auto_differently_are_refused_naming_the_dtype(tmp_path):
    """`dtype: auto` is resolved by a probe on each machine; a rank whose probe picks another dtype (another CPU, a
    stale cache) must not train beside rank 0: every rank stops with one message naming the rank and both dtypes."""
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({**PARAMS, "dtype": "auto"}))
    make_rows().save_to_disk(str(tmp_path / "rows"))
    faults = str(Path(__file__).resolve().parent / "faults")  # its sitecustomize changes rank 1's probe
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "C2LLM_FAULT_RANK": "1", "C2LLM_FAULT": "dtype",
           "PYTHONPATH": os.pathsep.join(filter(None, [faults, os.environ.get("PYTHONPATH")]))}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29518",
           "-m", "c2llm_lib.train", "--params", str(tmp_path / "p.yaml"), "--rows", str(tmp_path / "rows"),
           "--out", str(tmp_path / "ckpt")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode != 0
    assert "rank(s) [1] would train something else than rank 0" in proc.stderr
    assert "dtype:" in proc.stderr and "'float16' here" in proc.stderr
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").glob("step-*"))


def cli_error(capsys, args: list[str]) -> str:
    """The one line `python -m c2llm_lib.train` prints for a named error (exit status 1)."""
    from c2llm_lib.train.cli import main

    with pytest.raises(SystemExit) as stop:
        main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 1 and err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(PARAMS))
    make_rows().save_to_disk(str(tmp_path / "rows"))
    return tmp_path


def test_named_errors_print_one_line_and_exit_1(inputs, capsys):
    """They printed a traceback first (a raw KeyError, FileNotFoundError, YAMLError or UnicodeDecodeError)."""
    run = ["--params", str(inputs / "p.yaml"), "--rows", str(inputs / "rows"), "--out", str(inputs / "ckpt")]
    bad = inputs / "bad.yaml"
    for text, message in [
        (b"max_steps: [1, 2\n", r"does not parse as YAML: expected ',' or ']', but got '<stream end>' at line 2"),
        (b"learning_rat: 1.0e-4\n", r"unknown parameter\(s\) \['learning_rat'\]"),
        (b"seed: \xff\n", r"not UTF-8 text \(byte 0xff at 6\)"),
        (b"- 1\n- 2\n", "must be a flat mapping"),
    ]:
        bad.write_bytes(text)
        assert re.search(message, cli_error(capsys, ["--params", str(bad), *run[2:]])), message
    assert f"--params {inputs / 'nope.yaml'}: no such file" in cli_error(capsys, ["--params", str(inputs / "nope.yaml"),
                                                                                 *run[2:]])  # fmt: skip
    missing = cli_error(capsys, [*run[:2], "--rows", str(inputs / "no-rows"), *run[4:]])
    assert missing.startswith(f"error: --rows {inputs / 'no-rows'}: no such folder")
    (inputs / "empty").mkdir()
    assert "not a prepared dataset" in cli_error(capsys, [*run[:2], "--rows", str(inputs / "empty"), *run[4:]])
    (inputs / "p.yaml").write_text(yaml.safe_dump({**PARAMS, "loss_weights": {"Sett0": 2.0}}))  # from the trainer
    assert "(did you mean 'Set0'?)" in cli_error(capsys, run)


def test_a_real_crash_keeps_its_traceback(inputs):
    make_rows().remove_columns("language").save_to_disk(str(inputs / "odd-rows"))
    cmd = [sys.executable, "-m", "c2llm_lib.train", "--params", str(inputs / "p.yaml"), "--rows",
           str(inputs / "odd-rows"), "--out", str(inputs / "ckpt")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ValueError: Column 'language'" in proc.stderr
    cmd[cmd.index("--rows") + 1] = str(inputs / "no-rows")  # a named error, in the real entry point: one line only
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert (
        proc.returncode == 1
        and proc.stderr
        == f"error: --rows {inputs / 'no-rows'}: no such folder (a prepared dataset, e.g. outputs/<run>/data/train)\n"
    )
