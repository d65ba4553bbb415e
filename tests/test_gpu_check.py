"""`make gpu-check` (tools/gpu_check.py) rehearsed on a CPU at tiny sizes, so that the one command a GPU machine gets
works the day one is lent; and the check broken on purpose: a failing part and a hanging part are named, the others
still run, the exit status is 1 and nothing of the hung part is left running."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CUDA

REPO = Path(__file__).resolve().parent.parent
FILES = {"gpu_check.json", "gpu_check.md", "gpu_check.log", "profile.md"}  # a device machine returns at most 8


def gpu_check(out: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **env}
    cmd = [sys.executable, str(REPO / "tools" / "gpu_check.py"), "--out", str(out), "--size", "tiny", *args]
    return subprocess.run(cmd, cwd=REPO, env=environ, capture_output=True, text=True, timeout=600)


def parts_still_running(out: Path) -> list[str]:
    """Command lines of processes that belong to a check writing to `out`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(out) in text and "--part" in text:
            found.append(text)
    return found


@pytest.mark.slow
def test_the_cpu_rehearsal_runs_every_part_and_writes_every_figure(tmp_path):
    done = gpu_check(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p.name for p in tmp_path.iterdir()} == FILES
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    parts = report["parts"]
    assert list(parts) == ["environment", "gpu_tests", "preflight_05b", "encode", "profile", "preflight_7b", "smoke"]
    assert report["failed"] == [] and report["size"] == "tiny" and report["commit"]
    if not CUDA:
        assert parts["gpu_tests"]["status"] == "skipped: no CUDA"
        assert parts["environment"]["figures"]["gpu"] == "skipped: no CUDA"
    assert parts["gpu_tests"]["figures"]["skipped" if not CUDA else "passed"] >= 6  # the tests marked gpu
    for name in ("preflight_05b", "preflight_7b"):
        figures = parts[name]["figures"]
        assert figures["memory"]["fits"] and figures["speed"]["tokens_per_second"] > 0
        # the probe's FLOPs per step and the plan's for the same recipe come from one rule
        assert figures["speed"]["flops_per_step"] == pytest.approx(figures["plan"]["flops_per_device_step"])
        assert figures["speed"]["hours_8_gpus"] > 0 and figures["inference"]["tokens_per_second"] > 0
        # timed as notebook 04 encodes after bf16 training: merge_last 4 x lora_r 64 stacked; the baselines bare
        assert figures["inference"]["adapter_rank"] == 256 and figures["inference"]["untrained_tokens_per_second"] > 0
    assert parts["preflight_7b"]["figures"]["grad_cache"] and not parts["preflight_05b"]["figures"]["grad_cache"]
    assert set(parts["encode"]["figures"]) >= {"pma_overhead_end_to_end", "encode_tokens_per_s_sorted"}
    assert parts["profile"]["figures"]["top"] and "| kernel | calls |" in (tmp_path / "profile.md").read_text()
    smoke = parts["smoke"]["figures"]
    assert all(r["status"] == "finished" for r in smoke["notebooks"].values()) and smoke["html_copies"] == 2
    summary = (tmp_path / "gpu_check.md").read_text()
    assert "| preflight_7b | ok |" in summary and "| the paper's run on 8 such GPUs" in summary
    assert "texts, merged adapter of rank 256) |" in summary and "the untrained baselines' backbone |" in summary


def test_a_failing_and_a_hanging_part_are_named_and_the_others_run(tmp_path):
    out = tmp_path / "out"
    limits = ["--limit", "environment=5", "gpu_tests=5"]  # the hung part gets 5 s and what environment left unused
    done = gpu_check(out, "--only", "environment", "gpu_tests", "encode", *limits,
                     C2LLM_GPU_CHECK_FAIL="environment", C2LLM_GPU_CHECK_HANG="gpu_tests")  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((out / "gpu_check.json").read_text())
    parts = report["parts"]
    assert parts["environment"]["status"] == "failed" and "planted in environment" in parts["environment"]["error"]
    hung = parts["gpu_tests"]
    assert hung["status"] == "timed out" and 5 <= hung["limit_s"] <= 10 and hung["seconds"] < 11
    assert f"within {hung['limit_s']} s" in hung["error"]
    assert "hanging on purpose" in hung["error"]  # the part's last output, quoted
    assert parts["encode"]["status"] == "ok" and parts["encode"]["figures"]["real_tokens"] > 0
    assert report["failed"] == ["environment", "gpu_tests"]
    assert "failed: environment, gpu_tests" in done.stdout
    summary = (out / "gpu_check.md").read_text()
    assert "| environment | failed |" in summary and "| gpu_tests | timed out |" in summary
    assert parts_still_running(out) == []  # the hung part's process group was killed


def test_a_limit_for_an_unknown_part_is_refused(tmp_path):
    done = gpu_check(tmp_path, "--limit", "nothing=5")
    assert done.returncode != 0 and "PART=SECONDS" in done.stderr


def test_missing_wheels_are_reported_and_fail_the_check(tmp_path):
    (tmp_path / "wheels").mkdir()
    done = gpu_check(tmp_path / "out", "--only", "environment", "--wheels", str(tmp_path / "wheels"))
    assert done.returncode == 1
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["failed"] == ["wheels"] and "make gpu-wheels" in report["wheels"]["error"]
    assert report["parts"]["environment"]["status"] == "ok"  # the image's own packages still run the rest
