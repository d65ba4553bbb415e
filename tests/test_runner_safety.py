"""The runner never loses data and never calls a broken run finished: run names, what --overwrite may delete,
dead kernels, what --resume keeps, the run lock, the manifest, and the parameters refused before anything runs.

The pipeline tests here run a fake pipeline: copies of the six notebooks with their real parameters cells and a
one-line body each that reads and writes plain files in the run directory the way the real stages do
(01 writes data/train, 02 reads it and writes a checkpoint and metrics/train.json, 03 merges, 04 and 05 read
merged/, 06 reads the training record), so that each notebook takes a kernel start and nothing more.
"""

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from c2llm_lib.config import (
    AttentionStage,
    CompareStage,
    ConfigError,
    DataStage,
    EvalStage,
    MergeStage,
    ModelConfig,
    TrainConfig,
    from_dict,
)
from c2llm_lib.notebook import NOTEBOOK_DIR, STAGES, parameters_cell
from c2llm_lib.pipeline import PipelineError, load_params, main, parse_sets, run_pipeline
from c2llm_lib.runs import RunDir, RunInUse, check_run_name

REPO = Path(__file__).resolve().parent.parent
QUIET = {"log": lambda *_: None}

PROLOGUE = """import json, os, pathlib
root = pathlib.Path(outputs_dir) / run
def read(p):
    return (root / p).read_text()
def write(p, text):
    (root / p).parent.mkdir(parents=True, exist_ok=True)
    (root / p).write_text(text)"""
BODIES = {
    "01_data_prep": "write('data/train/rows.txt', f'rows, seed {seed}')",
    "02_train_lora_contrastive": "read('data/train/rows.txt')\n"
    "write('checkpoints/step-000001/w.txt', str(learning_rate))\n"
    "write('metrics/train.json', json.dumps({'learning_rate': learning_rate}))",
    "03_merge_checkpoints": "write('merged/m.txt', read('checkpoints/step-000001/w.txt'))",
    "04_eval_mteb_code": "write('metrics/eval.json', json.dumps({'merged': read('merged/m.txt')}))",
    "05_pma_attention": "write('metrics/attention.json', json.dumps({'merged': read('merged/m.txt')}))",
    "06_recipe_comparison": "write('metrics/comparison.json', read('metrics/train.json'))",
    "07_search_code": "write('metrics/search.json', json.dumps({'merged': read('merged/m.txt')}))",
}
KILL = "if (root / 'kill-me').exists():\n    os.kill(os.getpid(), 9)  # as the out-of-memory killer would"
GROW = (
    "if (root / 'allocate-mib').exists():  # touched bytes, so resident\n"
    "    block = b'x' * (int(read('allocate-mib')) * 2**20)\n    del block"
)


@pytest.fixture
def fake(tmp_path):
    """(notebook_dir, params_file, outputs) of the fake pipeline; notebook 02 dies while `<run>/kill-me` exists, and
    holds as many MiB as `<run>/allocate-mib` says while it exists."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for name in STAGES:
        real = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
        index, _ = parameters_cell(NOTEBOOK_DIR / f"{name}.ipynb")
        cells = [real.cells[index], nbformat.v4.new_code_cell(PROLOGUE)]
        if name == "02_train_lora_contrastive":
            cells += [nbformat.v4.new_code_cell(KILL), nbformat.v4.new_code_cell(GROW)]
        cells += [nbformat.v4.new_code_cell(BODIES[name]), nbformat.v4.new_code_cell("print('done')")]
        real.cells = cells
        nbformat.write(real, notebooks / f"{name}.ipynb")
    params = tmp_path / "fake.yaml"
    params.write_text("seed: 0\n")
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    return notebooks, params, outputs


def manifest(run_root: Path) -> dict:
    return json.loads((run_root / "manifest.json").read_text())


# run names -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\\b", "../elsewhere"])
def test_a_run_name_must_be_a_plain_name(name):
    with pytest.raises(ConfigError, match="not a plain run name"):
        check_run_name(name)


@pytest.mark.parametrize("stem", [".", ".."])  # `..yaml` named the outputs folder, `...yaml` its parent
def test_a_dot_named_params_file_deletes_nothing(tmp_path, stem):
    outputs = tmp_path / "repo" / "outputs"
    (outputs / "earlier-run").mkdir(parents=True)
    (outputs / "earlier-run" / "manifest.json").write_text("{}")
    (tmp_path / "repo" / "README.md").write_text("the repository")
    params = tmp_path / "repo" / f"{stem}.yaml"
    params.write_text("seed: 0\n")
    with pytest.raises(ConfigError, match="not a plain run name"):
        run_pipeline(params, mode="overwrite", outputs=outputs, **QUIET)
    assert (outputs / "earlier-run" / "manifest.json").is_file()
    assert (tmp_path / "repo" / "README.md").read_text() == "the repository"


def test_a_notebook_refuses_a_run_outside_the_outputs_folder(tmp_path):
    with pytest.raises(ConfigError, match="parameter 'run'.*not a plain run name"):
        RunDir.open("../elsewhere", tmp_path / "outputs")
    assert not (tmp_path / "elsewhere").exists()


# where --overwrite may delete ----------------------------------------------------------------------------------
def test_overwrite_refuses_a_run_directory_that_resolves_elsewhere(tmp_path):
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    (elsewhere / "thesis.tex").write_text("years of work")
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "run").symlink_to(elsewhere)
    with pytest.raises(FileExistsError, match="outside"):
        RunDir.create(outputs / "run", "overwrite")
    assert (elsewhere / "thesis.tex").read_text() == "years of work"


def test_overwrite_only_deletes_nothing_through_a_symlinked_folder(tmp_path):
    elsewhere = tmp_path / "shared-figures"
    elsewhere.mkdir()
    (elsewhere / "attention_0.png").write_text("another project's figure")
    root = tmp_path / "outputs" / "run"
    (root / "metrics").mkdir(parents=True)
    (root / "figures").symlink_to(elsewhere)
    with pytest.raises(FileExistsError, match="outside the run directory"):
        RunDir.create(root, "overwrite", replace=["figures/attention_*"])
    assert (elsewhere / "attention_0.png").is_file()


def test_overwrite_only_04_keeps_what_04_reads(fake):
    notebooks, params, outputs = fake
    run_pipeline(params, only=["01", "02", "03", "04"], outputs=outputs, notebook_dir=notebooks, **QUIET)
    root = outputs / "fake"
    (root / "metrics" / "eval.json").write_text('{"merged": "an earlier evaluation"}')
    lines = []
    run_pipeline(params, only=["04"], mode="overwrite", outputs=outputs, notebook_dir=notebooks, log=lines.append)
    assert lines[0].startswith("[04_eval_mteb_code] running") and len(lines) == 2
    assert (root / "data" / "train" / "rows.txt").is_file() and (root / "checkpoints" / "step-000001").is_dir()
    assert json.loads((root / "metrics" / "eval.json").read_text()) == {"merged": "0.0001"}  # rerun on merged/
    record = manifest(root)
    assert record["status"] == "finished" and record["notebooks"]["04_eval_mteb_code"]["status"] == "finished"
    assert record["notebooks"]["03_merge_checkpoints"]["status"] == "finished"  # kept, and still current


def test_overwrite_only_02_replaces_the_launchers_logs(fake):
    notebooks, params, outputs = fake
    run_pipeline(params, only=["01", "02"], outputs=outputs, notebook_dir=notebooks, **QUIET)
    stale = outputs / "fake" / "logs" / "02_train" / "torchrun.log"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier training's ranks")
    run_pipeline(params, only=["02"], mode="overwrite", outputs=outputs, notebook_dir=notebooks, **QUIET)
    assert not stale.exists()  # notebook 02's product, replaced with its checkpoints


# a dead kernel is a failure ------------------------------------------------------------------------------------
def test_a_dead_kernel_fails_the_notebook_and_resume_reruns_it(fake):
    notebooks, params, outputs = fake
    root = outputs / "fake"
    root.mkdir()
    (root / "kill-me").write_text("")
    with pytest.raises(PipelineError, match=r"02_train_lora_contrastive failed: its kernel died in cell \[\d+\]"):
        run_pipeline(params, only=["01", "02", "03"], mode="resume", outputs=outputs, notebook_dir=notebooks, **QUIET)
    record = manifest(root)
    assert record["status"] == "failed" and record["failed_notebook"] == "02_train_lora_contrastive"
    assert "kernel died" in record["error"]
    statuses = [record["notebooks"][n]["status"] for n in ("01_data_prep", "02_train_lora_contrastive",
                                                           "03_merge_checkpoints")]  # fmt: skip
    assert statuses == ["finished", "failed", "not reached"]
    (root / "kill-me").unlink()
    lines = []
    run_pipeline(params, only=["01", "02", "03"], mode="resume", outputs=outputs, notebook_dir=notebooks,
                 log=lines.append)  # fmt: skip
    assert lines[0] == "[01_data_prep] done earlier with the same parameters and inputs: kept"
    assert lines[1].startswith("[02_train_lora_contrastive] running (it did not finish")
    assert (root / "merged" / "m.txt").read_text() == "0.0001"
    record = manifest(root)  # the resumed run's success clears the failure
    assert record["status"] == "finished" and "failed_notebook" not in record and "error" not in record
    assert {r["status"] for r in record["notebooks"].values()} == {"finished"}


def test_the_manifest_records_each_notebooks_peak_memory(fake):
    """Known answer: notebook 02 touches 400 MiB, the others nothing; each record holds its own kernel's peak."""
    notebooks, params, outputs = fake
    root = outputs / "fake"
    root.mkdir()
    (root / "allocate-mib").write_text("400")
    lines = []
    run_pipeline(params, only=["01", "02", "03"], mode="resume", outputs=outputs, notebook_dir=notebooks,
                 log=lines.append)  # fmt: skip
    record = manifest(root)["notebooks"]
    peaks = {name: record[name]["peak_rss_kib"] for name in record}
    assert peaks["02_train_lora_contrastive"] >= 400 * 1024, peaks
    assert 0 < peaks["01_data_prep"] < 400 * 1024 and 0 < peaks["03_merge_checkpoints"] < 400 * 1024, peaks
    assert "peak resident memory" in lines[-1]


# what --resume keeps -------------------------------------------------------------------------------------------
def test_resume_reruns_what_read_a_changed_input(fake):
    notebooks, params, outputs = fake
    root = outputs / "fake"
    first = ["01", "02", "03", "04"]
    run_pipeline(params, only=first, outputs=outputs, notebook_dir=notebooks, **QUIET)
    lines = []
    run_pipeline(params, only=first, mode="resume", outputs=outputs, notebook_dir=notebooks, log=lines.append)
    assert len(lines) == 4 and all(line.endswith("kept") for line in lines)  # nothing changed: nothing reruns
    lines.clear()  # a new learning rate retrains, on its own first
    sets = {"learning_rate": 1e-3}
    run_pipeline(params, only=["02"], sets=sets, mode="resume", outputs=outputs, notebook_dir=notebooks, **QUIET)
    record = manifest(root)["notebooks"]
    assert record["02_train_lora_contrastive"]["status"] == "finished"
    assert record["03_merge_checkpoints"]["status"] == "stale" and record["04_eval_mteb_code"]["status"] == "stale"
    run_pipeline(params, only=first, sets=sets, mode="resume", outputs=outputs, notebook_dir=notebooks,
                 log=lines.append)  # fmt: skip
    assert lines[0].endswith("kept") and lines[1].endswith("kept")  # 01 and 02 (02 already ran with it)
    assert lines[2].startswith("[03_merge_checkpoints] running (its inputs changed since it ran: checkpoints")
    assert lines[4].startswith("[04_eval_mteb_code] running (its inputs changed since it ran: merged")
    assert (root / "merged" / "m.txt").read_text() == "0.001"  # not the old merged model
    assert json.loads((root / "metrics" / "eval.json").read_text()) == {"merged": "0.001"}  # nor its results


# two runners on one run directory ------------------------------------------------------------------------------
def test_a_second_runner_is_refused_naming_the_run(fake):
    notebooks, params, outputs = fake
    holder = RunDir.create(outputs / "fake", "new")
    try:
        with pytest.raises(RunInUse, match=r"run 'fake' .* is in use by another pipeline runner \(pid \d+\)"):
            run_pipeline(params, mode="resume", outputs=outputs, notebook_dir=notebooks, **QUIET)
    finally:
        holder.release()
    RunDir.create(outputs / "fake", "resume").release()  # free again once released


def test_a_killed_runner_leaves_no_lock_behind(tmp_path):
    script = "import sys, time\nfrom c2llm_lib.runs import RunDir\nrun = RunDir.create(sys.argv[1], 'new')\nprint('locked', flush=True)\ntime.sleep(60)\n"  # noqa: E501
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "run")], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout.readline().strip() == b"locked"
        with pytest.raises(RunInUse):
            RunDir.create(tmp_path / "run", "resume")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    RunDir.create(tmp_path / "run", "resume").release()  # the lock died with the process
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / ".lock").write_text("12345\n")  # a runner killed right after taking its lock
    RunDir.create(tmp_path / "fresh", "new").release()  # a lock file alone is no run


# parameters ----------------------------------------------------------------------------------------------------
REFUSED = [
    (TrainConfig, {"max_grad_norm": -1.0}, "'max_grad_norm' must be positive"),
    (TrainConfig, {"max_grad_norm": 0.0}, "'max_grad_norm' must be positive"),
    (TrainConfig, {"learning_rate": -1e-4}, "'learning_rate' must be >= 0"),
    (TrainConfig, {"pma_learning_rate": -1e-4}, "'pma_learning_rate' must be >= 0"),
    (TrainConfig, {"pma_attention_learning_rate": -1e-4}, "'pma_attention_learning_rate' must be >= 0"),
    (
        TrainConfig,
        {"pma_learning_rate": 0.0, "pma_attention_learning_rate": 3e-3},
        "'pma_attention_learning_rate' is set, but a head learning rate of 0",
    ),
    (TrainConfig, {"learning_rate": 0.0, "pma_attention_learning_rate": 3e-3}, "freezes the whole head"),
    (TrainConfig, {"weight_decay": -0.01}, "'weight_decay' must be >= 0"),
    (TrainConfig, {"max_length": 10**8}, "'max_length' must be at least 2 tokens and at most"),
    (TrainConfig, {"max_length": 1}, "'max_length' must be at least 2"),
    (TrainConfig, {"checkpoint_steps": [0]}, "'checkpoint_steps' must be positive"),
    (TrainConfig, {"max_steps": 10, "checkpoint_steps": [5, 20]}, r"'checkpoint_steps' \[20\] lie beyond max_steps"),
    (TrainConfig, {"checkpoint_steps": [5, 5]}, "'checkpoint_steps' repeats a step"),
    (TrainConfig, {"tau": math.inf}, "'tau' must be finite"),
    (TrainConfig, {"tau": math.nan}, "'tau' must be finite"),
    (TrainConfig, {"learning_rate": math.inf}, "'learning_rate' must be finite"),
    (TrainConfig, {"mrl_dims": [64], "mrl_weights": [math.nan]}, "'mrl_weights' must be finite"),
    (TrainConfig, {"loss_weights": {"CosQA": math.inf}}, "'loss_weights' must be finite"),
    (TrainConfig, {"loss_weights": {"CosQA": "high"}}, r"'loss_weights' must be dict\[str, float\]"),
    (TrainConfig, {"loss_weights": {1: 2.0}}, "'loss_weights' must be dict"),
    (TrainConfig, {"seed": -1}, "'seed' must be in"),
    (ModelConfig, {"lora_alpha": 0}, "'lora_alpha' must be positive"),
    (ModelConfig, {"lora_targets": ["q_proj", "q_proj"]}, "'lora_targets' repeats"),
    (ModelConfig, {"lora_targets": ["q-proj"]}, "'lora_targets' must be module names"),
    (ModelConfig, {"lora_dropout": math.nan}, "'lora_dropout' must be finite"),
    (ModelConfig, {"device": "gpu"}, "'device' must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"),
    (ModelConfig, {"device": "cuda:x"}, "'device' must be"),
    (ModelConfig, {"max_length": 10**8}, "'max_length' must be at least 2 tokens and at most"),
    (ModelConfig, {"gguf_file": ""}, "'gguf_file' must be None or non-empty"),
    (DataStage, {"seed": 2**40}, "'seed' must be in"),
    (DataStage, {"hub_sources": ["CosQA", "CosQA"]}, "'hub_sources' repeats"),
    (DataStage, {"data_source": "hub", "hub_sources": []}, "'hub_sources' must name a source"),
    (MergeStage, {"merge_last": 2, "merge_weights": [math.nan, 1.0]}, "'merge_weights' must be finite"),
    (MergeStage, {"merge_last": 2, "merge_weights": [-1.0, 2.0]}, "'merge_weights' must be non-negative"),
    (MergeStage, {"merge_last": 2, "merge_weights": [0.0, 0.0]}, "not all zero"),
    (EvalStage, {"eval_max_length": 0}, "'eval_max_length' must be at least 2"),
    (EvalStage, {"eval_batch_size": 0}, "'eval_batch_size' must be positive"),
    (EvalStage, {"baselines": ["bm25", "bm25"]}, "'baselines' repeats"),
    (EvalStage, {"ablation_dims": [128, 128]}, "'ablation_dims' repeats"),
    (EvalStage, {"eval_released_revision": "abc123"}, "set eval_released too"),
    (AttentionStage, {"attention_max_tokens": 10**9}, "'attention_max_tokens' must be between"),
    (CompareStage, {"compare_recipes": ["../../secret"]}, "'compare_recipes' must be params file stems"),
    (CompareStage, {"eval_max_length": -5}, "'eval_max_length' must be at least 2"),
]


@pytest.mark.parametrize("cls,values,message", REFUSED, ids=lambda v: str(v)[:40] if isinstance(v, dict) else None)
def test_a_value_out_of_range_is_refused_naming_the_key(cls, values, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(cls, values, "params/x.yaml")


@pytest.mark.parametrize(
    "cls,values",
    [
        (TrainConfig, {"pma_learning_rate": 0.0}),  # a frozen head
        (TrainConfig, {"max_steps": 20, "checkpoint_steps": [5, 10, 15, 20]}),
        (ModelConfig, {"device": "cuda:1"}),
        (ModelConfig, {"device": "mps"}),
        (TrainConfig, {"loss_weights": {"CodeEditSearchRetrieval": 0.5, "CosQA": 2}}),
        (MergeStage, {"merge_last": 2, "merge_weights": [0.0, 1.0]}),
    ],
)
def test_values_in_range_are_accepted(cls, values):
    config = from_dict(cls, values, "params/x.yaml")
    assert all(getattr(config, k) == v for k, v in values.items())


def test_a_range_error_stops_the_runner_before_anything_runs(fake):
    notebooks, params, outputs = fake
    params.write_text("max_grad_norm: -1.0\n")
    with pytest.raises(ConfigError, match=r"fake.yaml \(notebook 02_train_lora_contrastive\).*'max_grad_norm'"):
        run_pipeline(params, outputs=outputs, notebook_dir=notebooks, **QUIET)
    assert not (outputs / "fake").exists()


PARAMS_FILES = [  # text of a params file, and the error it must give (None: it loads)
    ("", "holds no parameters"),
    ("# only a comment\n", "holds no parameters"),
    ("tau: 0.05\nseed: 1\ntau: 0.1\n", r"the key 'tau' is given twice \(lines 1 and 3\)"),
    ("loss_weights: {CosQA: 1.0, CosQA: 2.0}\n", "the key 'CosQA' is given twice"),
    ("learning_rate: [1, 2\n", "does not parse as YAML"),
]


@pytest.mark.parametrize("text,message", PARAMS_FILES)
def test_a_bad_params_file_is_refused(tmp_path, text, message):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"p.yaml: {message}"):
        load_params(path)


NUMBERS = [("1e-3", 1e-3), ("5E4", 5e4), ("1.0e5", 1e5), ("-2e-4", -2e-4), ("+3e2", 300.0), ("1.5e-3", 1.5e-3),
           ("0.0001", 1e-4), ("3", 3), ("1e3x", "1e3x"), (".inf", math.inf)]  # fmt: skip


@pytest.mark.parametrize("text,value", NUMBERS)
def test_exponent_numbers_read_as_floats_in_files_and_sets(tmp_path, text, value):
    path = tmp_path / "p.yaml"
    path.write_text(f"learning_rate: {text}\n")
    for got in (load_params(path)["learning_rate"], parse_sets([f"learning_rate={text}"])["learning_rate"]):
        assert got == value and type(got) is type(value)


def test_a_key_set_twice_is_refused(tmp_path, capsys):
    with pytest.raises(ConfigError, match="--set: the key 'tau' is given twice"):
        parse_sets(["tau=0.1", "tau=0.2"])
    params = tmp_path / "p.yaml"
    params.write_text("seed: 0\nnot_a_key: 1\n")  # were the second --set let through, this stops the run
    assert main([str(params), "--set", "tau=0.1", "--set", "tau=0.2", "--outputs", str(tmp_path / "out")]) == 1
    assert "the key 'tau' is given twice" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
