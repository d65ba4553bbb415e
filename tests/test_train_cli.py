"""The torchrun entry point: 2 processes on CPU (gloo) train from a params file and a prepared dataset."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from c2llm_lib.config import ConfigError
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
