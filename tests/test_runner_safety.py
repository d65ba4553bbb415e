"""The runner never loses data and never calls a broken run finished: run names, what --overwrite may delete,
dead kernels, what --resume keeps, the run lock, the manifest, and the parameters refused before anything runs.

The pipeline tests here run a fake pipeline: copies of the six notebooks with their real parameters cells and a
one-line body each that reads and writes plain files in the run directory the way the real stages do
(01 writes data/train, 02 reads it and writes a checkpoint and metrics/train.json, 03 merges, 04 and 05 read
merged/, 04 writes its optional products when asked, 06 reads the training record), so that each notebook takes a
kernel start and nothing more.
"""

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from c2llm_lib.checks import ConfigError
from c2llm_lib.config import (
    AttentionStage,
    CompareStage,
    DataStage,
    EvalStage,
    MergeStage,
    ModelConfig,
    TrainConfig,
    from_dict,
)
from c2llm_lib.notebook import NOTEBOOK_DIR, STAGES, parameters_cell
from c2llm_lib.params import load_params, parse_sets
from c2llm_lib.pipeline import PipelineError, main, run_pipeline
from c2llm_lib.runs import RunDir, RunInUse, check_run_name
from tools.launch import training_reason

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
    "04_eval_mteb_code": "write('metrics/eval.json', json.dumps({'merged': read('merged/m.txt')}))\n"
    "write('metrics/results.md', 'scores of the model merged from ' + read('merged/m.txt'))\n"
    "if baselines == ['bm25']:\n    write('metrics/unseen.json', 'a table beside BM25 alone')\n"
    "if mteb_tasks:\n    write('metrics/mteb_code.md', 'benchmarks')",
    "05_pma_attention": "write('metrics/attention.json', json.dumps({'merged': read('merged/m.txt')}))",
    "06_recipe_comparison": "write('metrics/comparison.json', read('metrics/train.json'))",
    "07_search_code": "write('metrics/search.json', json.dumps({'merged': read('merged/m.txt')}))",
}
KILL = "if (root / 'kill-me').exists():\n    os.kill(os.getpid(), 9)  # as the out-of-memory killer would"
GROW = (  # the kernel then lives on for many of the runner's sampling intervals (a peak in the last one is missed)
    "if (root / 'allocate-mib').exists():  # touched bytes, so resident\n"
    "    block = b'x' * (int(read('allocate-mib')) * 2**20)\n    del block\n"
    "    import time\n    time.sleep(2)"
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


def test_a_runs_text_products_are_written_whole_and_only_inside_it(tmp_path, monkeypatch):
    import c2llm_lib.files

    run = RunDir.open("run", tmp_path / "outputs")
    table = run.save_text("results.md", "the first table")
    record = run.save_json("metrics/eval.json", {"model": {"task": 1.0}})

    def killed(*args):
        raise KeyboardInterrupt  # stopped between writing the new text and putting it in place

    monkeypatch.setattr(c2llm_lib.files.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        run.save_text("results.md", "a second table")
    monkeypatch.undo()
    assert table.read_text() == "the first table" and json.loads(record.read_text()) == {"model": {"task": 1.0}}
    assert sorted(p.name for p in (run.root / "metrics").iterdir()) == ["eval.json", "results.md"]  # no temporary
    assert run.save_notebook_html("04_eval_mteb_code", "<p>") == run.root / "notebooks" / "04_eval_mteb_code.html"
    for outside in ("../../escape.md", str(tmp_path / "absolute.md")):
        with pytest.raises(ValueError, match="not a path inside the run directory"):
            run.save_text(outside, "x")
    assert sorted(p.name for p in tmp_path.rglob("*.md")) == ["results.md"]


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
    (root / "manifest.json").write_text("{}")  # a run, so that only the symlink stands in the way
    (root / "figures").symlink_to(elsewhere)
    with pytest.raises(FileExistsError, match="outside the run directory"):
        RunDir.create(root, "overwrite", replace=["figures/attention_*"])
    assert (elsewhere / "attention_0.png").is_file()


def test_a_folder_that_never_held_a_run_is_neither_deleted_nor_run_into(fake):
    """notes.yaml run with --outputs <parent>, where <parent>/notes/ is a user's folder: the plain run said it
    "already holds a run", and --overwrite deleted notes/thesis.txt."""
    notebooks, _, outputs = fake
    params = fake[1].parent / "notes.yaml"
    params.write_text("seed: 0\n")
    (outputs / "notes" / "drafts").mkdir(parents=True)
    (outputs / "notes" / "thesis.txt").write_text("years of work")
    for mode in ("new", "overwrite", "resume"):
        with pytest.raises(FileExistsError) as refused:
            run_pipeline(params, mode=mode, outputs=outputs, notebook_dir=notebooks, **QUIET)
        assert str(refused.value) == (
            f"{outputs / 'notes'} holds drafts/, thesis.txt but no run (no manifest.json): the runner neither writes "
            "into nor deletes a folder it did not make; choose another run name (the params file's stem) or --outputs"
        )
    assert sorted(p.name for p in (outputs / "notes").iterdir()) == ["drafts", "thesis.txt"]  # no lock left either
    assert (outputs / "notes" / "thesis.txt").read_text() == "years of work"


def test_what_a_run_directory_holds_is_named_and_a_runner_killed_before_its_manifest_left_no_run(fake):
    notebooks, params, outputs = fake
    run_pipeline(params, only=["01"], outputs=outputs, notebook_dir=notebooks, **QUIET)
    with pytest.raises(FileExistsError, match=r"fake already holds a run \(data/, manifest.json, notebooks/, "
                       r"params.yaml, resolved.yaml\); resume it"):  # fmt: skip
        run_pipeline(params, only=["01"], outputs=outputs, notebook_dir=notebooks, **QUIET)
    stopped = outputs / "stopped"  # created, locked, then killed before the manifest: its empty folders are no run
    RunDir.create(stopped, "new").release()
    assert sorted(p.name for p in stopped.iterdir()) == [".lock", "checkpoints", "data", "figures", "metrics",
                                                         "notebooks"]  # fmt: skip
    RunDir.create(stopped, "new").release()


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
    (root / "manifest.json").write_text("{}")  # a run (a folder without a manifest is nobody's to run into)
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
    (root / "manifest.json").write_text("{}")  # a run (a folder without a manifest is nobody's to run into)
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


def test_resume_sees_a_checkpoint_swapped_with_its_size_and_time_kept(fake):
    """A checkpoint copied in from another training (`cp -p`: same names, sizes and modification times) was kept by
    --resume, and the merge it fed with it: small files are fingerprinted by their bytes (issue 23)."""
    notebooks, params, outputs = fake
    first = ["01", "02", "03"]
    run_pipeline(params, only=first, outputs=outputs, notebook_dir=notebooks, **QUIET)
    weights = outputs / "fake" / "checkpoints" / "step-000001" / "w.txt"
    stat = weights.stat()
    weights.write_text("0.0007")  # another training's, of the same size
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    lines = []
    run_pipeline(params, only=first, mode="resume", outputs=outputs, notebook_dir=notebooks, log=lines.append)
    assert lines[2].startswith("[03_merge_checkpoints] running (its inputs changed since it ran: checkpoints")
    assert (outputs / "fake" / "merged" / "m.txt").read_text() == "0.0007"


def test_a_rerun_removes_the_products_it_no_longer_writes(fake):
    """--resume reran notebook 04 without its ablations or benchmarks and kept their earlier tables beside the new
    evaluation (issue 23): a notebook's products are removed before it reruns, its caches (mteb/) aside."""
    notebooks, params, outputs = fake
    root, first = outputs / "fake", ["01", "02", "03", "04"]
    asked = {"baselines": ["bm25"], "mteb_tasks": ["all"]}  # two settings of notebook 04 alone
    run_pipeline(params, only=first, sets=asked, outputs=outputs, notebook_dir=notebooks, **QUIET)
    assert (root / "metrics" / "unseen.json").is_file() and (root / "metrics" / "mteb_code.md").is_file()
    (root / "mteb").mkdir()
    (root / "mteb" / "cached.json").write_text("{}")  # mteb's result cache: keyed by model and data, kept
    lines = []
    run_pipeline(params, only=first, mode="resume", outputs=outputs, notebook_dir=notebooks, log=lines.append)
    assert lines[3].startswith("[04_eval_mteb_code] running (its parameters changed: baselines, mteb_tasks")
    assert not (root / "metrics" / "unseen.json").exists() and not (root / "metrics" / "mteb_code.md").exists()
    assert (root / "metrics" / "eval.json").is_file() and (root / "mteb" / "cached.json").is_file()


def test_only_refuses_a_notebook_whose_upstream_is_stale(fake):
    """After --only 02 with a new learning rate, --only 04 evaluated the old merged/ (issue 23): it is refused, naming
    the stale upstream notebook and the command, and a plain --resume reruns the stale notebooks."""
    notebooks, params, outputs = fake
    root, run = outputs / "fake", {"outputs": outputs, "notebook_dir": notebooks, **QUIET}
    run_pipeline(params, only=["01", "02", "03", "04"], **run)
    new_rate = {"learning_rate": 1e-3}
    run_pipeline(params, only=["02"], sets=new_rate, mode="resume", **run)
    before = (root / "manifest.json").read_text()
    with pytest.raises(PipelineError, match=r"--only 04: 04_eval_mteb_code reads merged from 03_merge_checkpoints, "
                       r"which is not current \(its inputs changed since it ran: checkpoints.*\)\. Run "
                       r"python -m c2llm_lib\.pipeline .*fake\.yaml --resume --only 03 04"):  # fmt: skip
        run_pipeline(params, only=["04"], sets=new_rate, mode="resume", **run)
    assert (root / "manifest.json").read_text() == before  # refused before anything ran or was recorded
    assert json.loads((root / "metrics" / "eval.json").read_text()) == {"merged": "0.0001"}
    lines = []
    run_pipeline(params, only=["01", "02", "03", "04"], sets=new_rate, mode="resume", outputs=outputs,
                 notebook_dir=notebooks, log=lines.append)  # fmt: skip
    assert [line.split("]")[0][1:3] for line in lines if "running" in line] == ["03", "04"]
    assert json.loads((root / "metrics" / "eval.json").read_text()) == {"merged": "0.001"}
    # a notebook whose upstream went stale is stale too, though its own inputs did not change
    run_pipeline(params, only=["01"], sets={**new_rate, "seed": 1}, mode="resume", **run)
    statuses = {name: record["status"] for name, record in manifest(root)["notebooks"].items()}
    assert statuses == {"01_data_prep": "finished", "02_train_lora_contrastive": "stale",
                        "03_merge_checkpoints": "stale", "04_eval_mteb_code": "stale"}  # fmt: skip
    assert "02_train_lora_contrastive" in manifest(root)["notebooks"]["03_merge_checkpoints"]["reason"]
    # an upstream notebook whose parameters changed is not current either (data made with seed 1, asked for 2)
    with pytest.raises(PipelineError, match=r"01_data_prep, which is not current \(its parameters changed: seed\)"):
        run_pipeline(params, only=["02"], sets={**new_rate, "seed": 2}, mode="resume", **run)


def test_where_an_upstream_notebook_ran_does_not_make_it_stale(fake):
    """Two machines train through `c2llm_lib.launch` and `python -m tools.launch` (notebook 02 with nnodes and
    rdzv_endpoint set), then the pipeline merges with --only 03 and no launch keys: the training stands
    (docs/training.md, several machines)."""
    notebooks, params, outputs = fake
    run = {"outputs": outputs, "notebook_dir": notebooks, **QUIET}
    run_pipeline(params, only=["01"], **run)
    launch = {"nnodes": 2, "node_rank": 0, "rdzv_endpoint": "node001:29500", "nproc": 1}
    run_pipeline(params, only=["02"], sets=launch, mode="resume", **run)
    run_pipeline(params, only=["03"], mode="resume", **run)
    assert manifest(outputs / "fake")["notebooks"]["03_merge_checkpoints"]["status"] == "finished"


def test_resume_reruns_a_notebook_whose_code_or_recipe_file_changed(fake, tmp_path, monkeypatch):
    """A changed notebook, or a changed peer recipe file that notebook 06 reads, was kept by --resume (issue 23)."""
    import c2llm_lib.stages

    notebooks, params, outputs = fake
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    recipe = recipes / "jina-code-0.5b.yaml"
    recipe.write_text("learning_rate: 1.0e-4\n")
    monkeypatch.setattr(c2llm_lib.stages, "PARAMS_DIR", recipes)
    chosen, sets = ["01", "02", "03", "06"], {"compare_recipes": ["jina-code-0.5b"]}
    run_pipeline(params, only=chosen, sets=sets, outputs=outputs, notebook_dir=notebooks, **QUIET)
    recipe.write_text("learning_rate: 2.0e-4\n")
    merge = nbformat.read(notebooks / "03_merge_checkpoints.ipynb", as_version=4)
    merge.cells.append(nbformat.v4.new_code_cell("print('merged, and checked')"))
    nbformat.write(merge, notebooks / "03_merge_checkpoints.ipynb")
    lines = []
    run_pipeline(params, only=chosen, sets=sets, mode="resume", outputs=outputs, notebook_dir=notebooks,
                 log=lines.append)  # fmt: skip
    assert lines[0].endswith("kept") and lines[1].endswith("kept")
    assert lines[2].startswith("[03_merge_checkpoints] running (its inputs changed since it ran: notebook code)")
    assert lines[4].startswith("[06_recipe_comparison] running (its inputs changed since it ran: recipe "
                               "params/jina-code-0.5b.yaml)")  # fmt: skip
    markdown = nbformat.read(notebooks / "01_data_prep.ipynb", as_version=4)  # prose is not code: kept
    markdown.cells.append(nbformat.v4.new_markdown_cell("A note for readers."))
    nbformat.write(markdown, notebooks / "01_data_prep.ipynb")
    lines.clear()
    run_pipeline(params, only=chosen, sets=sets, mode="resume", outputs=outputs, notebook_dir=notebooks,
                 log=lines.append)  # fmt: skip
    assert all(line.endswith("kept") for line in lines) and len(lines) == 4


def reran(lines: list[str]) -> dict[str, str]:
    """{notebook number: the line saying why it runs} of a runner's log."""
    return {line[1:3]: line for line in lines if "] running" in line}


def test_resume_reruns_what_read_a_changed_input_outside_the_run(fake, tmp_path):
    """--resume kept notebook 01 after its data_files or code_roots were edited in place, and notebook 04 the scores
    of an edited BEIR set or hub mirror: the paths a notebook's parameters name outside the run are its inputs,
    fingerprinted by content (a code root by the files its mining walks)."""
    notebooks, params, outputs = fake
    pairs, mirror, beir, model, src = (tmp_path / n for n in ("pairs.jsonl", "mirror", "beir", "model", "src"))
    pairs.write_text('{"query": "q", "positive": "p"}\n')
    for folder in (mirror / "CoIR-Retrieval__apps", beir / "qrels", model, src / "ignored"):
        folder.mkdir(parents=True)
    (mirror / "CoIR-Retrieval__apps" / "README.md").write_text("configs: []\n")
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "text": "x"}\n')
    (model / "config.json").write_text('{"hidden_size": 64}')
    (src / "a.py").write_text("def f():\n    return 1\n")
    (src / ".gitignore").write_text("ignored/\n")
    (src / "ignored" / "b.py").write_text("def g():\n    return 2\n")
    sets = {"data_source": "files", "data_files": [str(pairs)], "hub_mirror": str(mirror),
            "beir_sets": ["../beir"], "backbone": str(model)}  # a relative path resolves from notebooks/  # fmt: skip
    chosen, lines = ["01", "02", "03", "04"], []

    def resume(changed: Path, text: str, **more) -> dict[str, str]:
        changed.write_text(text)
        lines.clear()
        run_pipeline(params, only=chosen, sets={**sets, **more}, mode="resume", outputs=outputs, notebook_dir=notebooks,
                     log=lines.append)  # fmt: skip
        return reran(lines)

    run_pipeline(params, only=chosen, sets=sets, outputs=outputs, notebook_dir=notebooks, **QUIET)
    changed = "running (its inputs changed since it ran: "
    pairs.write_text('{"query": "q2", "positive": "p"}\n')  # --only sees it too
    with pytest.raises(PipelineError, match=r"01_data_prep, which is not current \(its inputs changed since it ran: "
                       rf"data_files {re.escape(str(pairs))}\)"):  # fmt: skip
        run_pipeline(params, only=["02"], sets=sets, mode="resume", outputs=outputs, notebook_dir=notebooks, **QUIET)
    assert resume(pairs, '{"query": "q2", "positive": "p"}\n') == {
        "01": f"[01_data_prep] {changed}data_files {pairs}) ..."
    }
    assert list(resume(beir / "corpus.jsonl", '{"_id": "d1", "text": "y"}\n')) == ["04"]
    assert "beir_sets ../beir" in reran(lines)["04"]
    assert list(resume(mirror / "CoIR-Retrieval__apps" / "README.md", "configs: [1]\n")) == ["01", "04"]
    assert all(f"{changed}hub_mirror {mirror})" in line for line in reran(lines).values())
    assert list(resume(model / "config.json", '{"hidden_size": 32}')) == ["02"]  # same checkpoint: 03 is kept
    assert f"{changed}backbone {model})" in reran(lines)["02"]
    sets = {**sets, "data_source": "code", "data_files": [], "code_roots": [str(src)]}
    assert list(resume(src / "a.py", "def f():\n    return 1\n")) == ["01"]  # its parameters changed
    assert resume(src / "a.py", "def f():\n    return 3\n") == {"01": f"[01_data_prep] {changed}code_roots {src}) ..."}
    assert resume(src / "ignored" / "b.py", "def g():\n    return 4\n") == {}  # a file mining does not read


def test_resume_remakes_a_deleted_training_record_once(fake):
    """A finished run whose metrics/train.json was deleted: every --resume kept notebook 02 and reran the notebooks
    that read the record, which failed without it (notebook 03: "run 02 first"), run after run. Notebook 02 records
    what it made for later notebooks: one --resume reruns it, the next keeps everything, and --only 03 names it."""
    notebooks, params, outputs = fake
    root, chosen, lines = outputs / "fake", ["01", "02", "03", "06"], []
    run_pipeline(params, only=chosen, outputs=outputs, notebook_dir=notebooks, **QUIET)
    (root / "metrics" / "train.json").unlink()
    with pytest.raises(PipelineError, match=r"03_merge_checkpoints reads \S+ from 02_train_lora_contrastive, which is "
                       r"not current \(what it made for later notebooks is gone: metrics/train.json\)\. Run .* "
                       r"--resume --only 02 03"):  # fmt: skip
        run_pipeline(params, only=["03"], mode="resume", outputs=outputs, notebook_dir=notebooks, **QUIET)
    run_pipeline(params, only=chosen, mode="resume", outputs=outputs, notebook_dir=notebooks, log=lines.append)
    # it wrote the same record again: 03 and 06 are kept
    assert reran(lines) == {"02": "[02_train_lora_contrastive] running (what it made for later notebooks is gone: "
                            "metrics/train.json) ..."}  # fmt: skip
    lines.clear()
    run_pipeline(params, only=chosen, mode="resume", outputs=outputs, notebook_dir=notebooks, log=lines.append)
    assert len(lines) == 4 and all(line.endswith("kept") for line in lines)


def test_both_machines_of_a_launch_agree_whether_a_training_stands(fake):
    """A two-machine launch after a one-machine training: node 0's --resume counted the launch keys and trained again
    while node 1 ignored them, said "already finished" and left, and node 0 waited 600 s for it. Every machine now
    asks `rerun_reason` with node 0's parameters: where notebook 02 ran does not change what it made, so both keep a
    finished training, and both train for a new learning rate."""
    notebooks, params, outputs = fake
    run_pipeline(params, only=["01", "02"], outputs=outputs, notebook_dir=notebooks, **QUIET)
    launch, lines = {"nnodes": 2, "rdzv_endpoint": "node001:29500", "nproc": 1}, []
    assert training_reason(params, {**launch, "node_rank": 1}, None, outputs, notebooks) == ""  # nothing to join
    run_pipeline(params, only=["02"], sets={**launch, "node_rank": 0}, mode="resume", outputs=outputs,
                 notebook_dir=notebooks, log=lines.append)  # fmt: skip
    assert lines == ["[02_train_lora_contrastive] done earlier with the same parameters and inputs: kept"]
    launch["learning_rate"] = 1e-3
    node_1 = training_reason(params, {**launch, "node_rank": 1}, None, outputs, notebooks)
    assert node_1 == "its parameters changed: learning_rate"
    lines.clear()
    run_pipeline(params, only=["02"], sets={**launch, "node_rank": 0}, mode="resume", outputs=outputs,
                 notebook_dir=notebooks, log=lines.append)  # fmt: skip
    assert lines[0] == f"[02_train_lora_contrastive] running ({node_1}) ..."


def test_an_input_inside_the_run_directory_is_refused_before_anything_is_deleted(fake):
    """A code root inside the run directory was accepted, and a plain --overwrite deleted it with the run."""
    notebooks, params, outputs = fake
    root = outputs / "fake"
    run_pipeline(params, only=["01"], outputs=outputs, notebook_dir=notebooks, **QUIET)
    code = root / "my-code"
    code.mkdir()
    (code / "a.py").write_text("def f():\n    return 1\n")
    sets = {"data_source": "code", "code_roots": [str(code)]}
    for mode in ("overwrite", "resume"):
        with pytest.raises(ConfigError, match=rf"code_roots '{re.escape(str(code))}' \(notebook 01_data_prep\) lies "
                           rf"inside the run directory {re.escape(str(root))} .* which --overwrite deletes: move it "
                           rf"out of {re.escape(str(root))}"):  # fmt: skip
            run_pipeline(params, sets=sets, mode=mode, outputs=outputs, notebook_dir=notebooks, **QUIET)
    assert (code / "a.py").is_file() and (root / "data" / "train" / "rows.txt").is_file()
    (root / "data" / "pairs.jsonl").write_text("{}\n")  # any other path outside input, relative from notebooks/ too
    with pytest.raises(ConfigError, match=r"data_files '../outputs/fake/data/pairs.jsonl' \(notebook 01_data_prep\)"):
        run_pipeline(params, sets={"data_source": "files", "data_files": ["../outputs/fake/data/pairs.jsonl"]},
                     mode="overwrite", outputs=outputs, notebook_dir=notebooks, **QUIET)  # fmt: skip
    with pytest.raises(ConfigError, match=r"beir_sets '[^']*/fake/data' \(notebook 04_eval_mteb_code\)"):
        run_pipeline(params, sets={"beir_sets": [str(root / "data")]}, mode="overwrite", outputs=outputs,
                     notebook_dir=notebooks, **QUIET)  # fmt: skip
    assert (root / "data" / "pairs.jsonl").is_file()


def test_the_runner_prints_the_results_table_only_when_notebook_04_is_current(fake, monkeypatch, capsys):
    """`--resume --only 01 02 03` after a new learning rate printed the previous model's results.md as the run's
    table (issue 23); it says the table is stale, and why, instead."""
    import c2llm_lib.pipeline

    notebooks, params, outputs = fake
    real = c2llm_lib.pipeline.run_pipeline
    monkeypatch.setattr(c2llm_lib.pipeline, "run_pipeline", lambda *a, **k: real(*a, **k, notebook_dir=notebooks))
    args = [str(params), "--outputs", str(outputs)]
    assert main([*args, "--only", "01", "02", "03", "04"]) == 0
    assert "scores of the model merged from 0.0001" in capsys.readouterr().out
    assert main([*args, "--resume", "--only", "01", "02", "03", "--set", "learning_rate=1e-3"]) == 0
    out = capsys.readouterr().out
    assert "scores of the model merged from" not in out
    assert "metrics/results.md is stale: 04_eval_mteb_code is stale (its inputs changed since it ran: merged" in out
    assert "--resume" in out.splitlines()[-1]
    assert main([*args, "--resume", "--set", "learning_rate=1e-3"]) == 0
    assert "scores of the model merged from 0.001" in capsys.readouterr().out


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


def test_a_deleted_lock_file_does_not_let_a_second_runner_in(tmp_path):
    """The lock file held only a pid: deleted, it looked disposable and the next runner got a new lock at once."""
    run_dir = tmp_path / "run"
    script = ("import sys, time\nfrom pathlib import Path\nfrom c2llm_lib.runs import RunDir\n"
              "run = RunDir.create(sys.argv[1], 'new')\nrun.write_manifest(Path(sys.argv[1]), status='running')\n"
              "print('locked', flush=True)\ntime.sleep(60)\n")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", script, str(run_dir)], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout.readline().strip() == b"locked"
        lines = (run_dir / ".lock").read_text().splitlines()
        assert lines[0] == str(child.pid) and "pipeline runner" in lines[1] and "Do not delete it" in lines[1]
        (run_dir / ".lock").unlink()
        with pytest.raises(RunInUse, match=rf"in use by another pipeline runner \(pid {child.pid}, running since .*\), "
                           r"whose lock file .lock was deleted"):  # fmt: skip
            RunDir.create(run_dir, "resume")
        assert not (run_dir / ".lock").exists()  # the refused runner leaves no lock of its own
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    RunDir.create(run_dir, "resume").release()  # its runner is gone: the manifest's "running" is a dead runner's


def test_a_runner_whose_lock_file_is_deleted_takes_a_new_one(tmp_path):
    run = RunDir.create(tmp_path / "run", "new")
    try:
        (tmp_path / "run" / ".lock").unlink()
        run.check_lock()  # between notebooks
        assert (tmp_path / "run" / ".lock").read_text().startswith(f"{os.getpid()}\n")
        with pytest.raises(RunInUse, match="in use by another pipeline runner"):
            RunDir.create(tmp_path / "run", "resume")  # the lock holds again
        (tmp_path / "run" / ".lock").unlink()
        second = RunDir.create(tmp_path / "run", "resume")  # let in while the first runs between two checks
        with pytest.raises(RunInUse, match=r"this runner's lock file .lock was deleted while it ran, and run 'run'"):
            run.check_lock()  # the first stops rather than share the run
        second.release()
    finally:
        run.release()


# parameters ----------------------------------------------------------------------------------------------------
REFUSED = [
    (TrainConfig, {"max_grad_norm": -1.0}, "'max_grad_norm' must be positive"),
    (TrainConfig, {"max_grad_norm": 0.0}, "'max_grad_norm' must be positive"),
    (TrainConfig, {"learning_rate": -1e-4}, r"'learning_rate' must be in \[0, 0.1\]"),
    (TrainConfig, {"learning_rate": 1e30}, r"'learning_rate' must be in \[0, 0.1\] .*got 1e\+30"),  # was accepted
    (TrainConfig, {"pma_learning_rate": -1e-4}, r"'pma_learning_rate' must be in \[0, 0.1\]"),
    (TrainConfig, {"pma_learning_rate": 0.5}, r"'pma_learning_rate' must be in \[0, 0.1\] \(0 freezes"),
    (TrainConfig, {"pma_attention_learning_rate": -1e-4}, r"'pma_attention_learning_rate' must be in \[0, 0.1\]"),
    (TrainConfig, {"pma_attention_learning_rate": 3.0}, r"'pma_attention_learning_rate' must be in \[0, 0.1\]"),
    (TrainConfig, {"tau": 1e308}, r"'tau' must be in \[0.001, 10.0\] .*nothing trains.*got 1e\+308"),  # was silent
    (TrainConfig, {"tau": 1e-300}, r"'tau' must be in \[0.001, 10.0\]"),  # was a NaN loss that named no key
    (TrainConfig, {"tau": 0.0}, r"'tau' must be in"),
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
    (DataStage, {"hub_mirror": ""}, "'hub_mirror' must be None or a folder"),  # was: the working directory
    (EvalStage, {"hub_mirror": "  "}, "'hub_mirror' must be None or a folder"),
    (MergeStage, {"merge_last": 2, "merge_weights": [math.nan, 1.0]}, "'merge_weights' must be finite"),
    (MergeStage, {"merge_last": 2, "merge_weights": [-1.0, 2.0]}, "'merge_weights' must be non-negative"),
    (MergeStage, {"merge_last": 2, "merge_weights": [0.0, 0.0]}, "not all zero"),
    (EvalStage, {"eval_max_length": 0}, "'eval_max_length' must be at least 2"),
    (EvalStage, {"eval_batch_size": 0}, "'eval_batch_size' must be positive"),
    (EvalStage, {"baselines": ["bm25", "bm25"]}, "'baselines' repeats"),
    (EvalStage, {"untrained_sets": ["held-out"]}, "'untrained_sets' has unknown entries \\['held-out'\\]"),
    (EvalStage, {"untrained_sets": ["unseen", "unseen"]}, "'untrained_sets' repeats"),
    (EvalStage, {"untrained_sets": "unseen"}, "'untrained_sets'"),
    (CompareStage, {"compare_pma_dims": [128, 128]}, "'compare_pma_dims' must be distinct positive widths"),
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
        (TrainConfig, {"learning_rate": 0.1, "pma_learning_rate": 0.1, "pma_attention_learning_rate": 0.1}),
        (TrainConfig, {"tau": 1e-3}),
        (TrainConfig, {"tau": 10}),
        (TrainConfig, {"max_steps": 20, "checkpoint_steps": [5, 10, 15, 20]}),
        (ModelConfig, {"device": "cuda:1"}),
        (ModelConfig, {"device": "mps"}),
        (TrainConfig, {"loss_weights": {"CodeEditSearchRetrieval": 0.5, "CosQA": 2}}),
        (MergeStage, {"merge_last": 2, "merge_weights": [0.0, 1.0]}),
        (EvalStage, {"untrained_sets": []}),  # the untrained poolers score no set (and are not loaded)
        (EvalStage, {"untrained_sets": ["unseen"]}),  # make run's default
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


def test_a_key_set_twice_is_refused(tmp_path, capsys):
    with pytest.raises(ConfigError, match="--set: the key 'tau' is given twice"):
        parse_sets(["tau=0.1", "tau=0.2"])
    params = tmp_path / "p.yaml"
    params.write_text("seed: 0\nnot_a_key: 1\n")  # were the second --set let through, this stops the run
    assert main([str(params), "--set", "tau=0.1", "--set", "tau=0.2", "--outputs", str(tmp_path / "out")]) == 1
    assert "the key 'tau' is given twice" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_params_file_that_is_not_utf8_is_named(tmp_path, capsys):
    params = tmp_path / "p.yaml"
    params.write_bytes(b"seed: 0\n# caf\xe9 in Latin-1\n")  # was a raw UnicodeDecodeError with a traceback
    with pytest.raises(ConfigError, match=r"p.yaml: is not UTF-8 text \(byte 0xe9 on line 2\)"):
        load_params(params)
    assert main([str(params), "--outputs", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.startswith(f"error: {params}: is not UTF-8 text")
    assert not (tmp_path / "out").exists()


def test_outputs_that_is_a_file_is_refused_and_left_alone(tmp_path, capsys):
    params, notes = tmp_path / "p.yaml", tmp_path / "notes.txt"
    params.write_text("seed: 0\n")
    notes.write_text("mine\n")
    for outputs, where in [(notes, "is a file"), (notes / "deeper", f"lies under {notes}, which is a file")]:
        assert main([str(params), "--outputs", str(outputs)]) == 1  # was a raw NotADirectoryError with a traceback
        assert capsys.readouterr().err == f"error: --outputs {outputs}: {where}, not a folder for run directories; " \
            "choose a folder\n"  # fmt: skip
    assert notes.read_text() == "mine\n"
