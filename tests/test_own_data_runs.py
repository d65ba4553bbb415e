"""A run on your own data keeps its held-out split as `data/heldout`: notebook 01 saves it (and drops an earlier
source's), notebooks 04 and 05 read it, and --resume and --overwrite treat it as they treat data/train."""

import json
from pathlib import Path

import nbformat
import pytest
from datasets import load_from_disk

from c2llm_lib.files import MissingInput
from c2llm_lib.notebook import NOTEBOOK_DIR, STAGES, parameters_cell
from c2llm_lib.pipeline import run_pipeline
from c2llm_lib.runs import INPUTS, PRODUCERS, RunDir

REPO = Path(__file__).resolve().parent.parent
PAIRS = REPO / "tests" / "fixtures" / "own-pairs.jsonl"
QUIET = {"log": lambda *_: None}

PROLOGUE = """import json, pathlib
from c2llm_lib.runs import RunDir
root = pathlib.Path(outputs_dir) / run
def read(p):
    return (root / p).read_text()
def write(p, text):
    (root / p).parent.mkdir(parents=True, exist_ok=True)
    (root / p).write_text(text)"""
BODIES = {  # as the real stages: 01 writes data/train once and data/heldout for a files run; 04 and 05 read both
    "01_data_prep": "if not (root / 'data/train').exists():\n    write('data/train/rows.txt', 'rows')\n"
    "if data_source == 'files':\n    write('data/heldout/rows.txt', f'held out {files_heldout_fraction}')\n"
    "else:\n    RunDir(root).drop_dataset('heldout')",
    "02_train_lora_contrastive": "read('data/train/rows.txt')\nwrite('checkpoints/step-000001/w.txt', 'w')\n"
    "write('metrics/train.json', '{}')",
    "03_merge_checkpoints": "write('merged/m.txt', read('checkpoints/step-000001/w.txt'))",
    "04_eval_mteb_code": "held = read('data/heldout/rows.txt') if (root / 'data/heldout').exists() else 'offline'\n"
    "write('metrics/eval.json', json.dumps({'tasks': held}))",
    "05_pma_attention": "write('metrics/attention.json', '{}')",
    "06_recipe_comparison": "pass",
    "07_search_code": "pass",
}


@pytest.fixture
def fake(tmp_path):
    """(notebook_dir, params_file, outputs): the real parameters cells, one-line bodies (a kernel start each)."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for name in STAGES:
        real = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
        index, _ = parameters_cell(NOTEBOOK_DIR / f"{name}.ipynb")
        real.cells = [real.cells[index], nbformat.v4.new_code_cell(PROLOGUE), nbformat.v4.new_code_cell(BODIES[name])]
        nbformat.write(real, notebooks / f"{name}.ipynb")
    params = tmp_path / "mine.yaml"
    params.write_text(f"data_source: files\ndata_files: [{PAIRS}]\n")
    return notebooks, params, tmp_path / "outputs"


def status(root: Path) -> dict[str, str]:
    return {n: r["status"] for n, r in json.loads((root / "manifest.json").read_text())["notebooks"].items()}


@pytest.mark.slow
def test_resume_and_overwrite_treat_the_heldout_split_as_an_input(fake):
    notebooks, params, outputs = fake
    root, first = outputs / "mine", ["01", "02", "04"]  # 02 reads data/train only; 04 reads data/heldout too
    run = dict(outputs=outputs, notebook_dir=notebooks)
    run_pipeline(params, only=first, **run, **QUIET)
    assert json.loads((root / "metrics" / "eval.json").read_text()) == {"tasks": "held out 0.2"}
    # a new held-out share reruns 01 only; what read the old split is stale, what did not is kept
    run_pipeline(params, only=["01"], sets={"files_heldout_fraction": 0.3}, mode="resume", **run, **QUIET)
    assert status(root) == {"01_data_prep": "finished", "02_train_lora_contrastive": "finished",
                            "04_eval_mteb_code": "stale"}  # fmt: skip
    lines = []
    run_pipeline(params, only=first, sets={"files_heldout_fraction": 0.3}, mode="resume", **run, log=lines.append)
    assert [line.endswith("kept") for line in lines[:2]] == [True, True]
    assert lines[2] == "[04_eval_mteb_code] running (its inputs changed since it ran: data/heldout) ..."
    assert json.loads((root / "metrics" / "eval.json").read_text()) == {"tasks": "held out 0.3"}
    # an offline source holds nothing out: notebook 01 drops the split, and 04 evaluates on the offline tasks
    offline = {"data_source": "offline", "data_files": []}
    run_pipeline(params, only=first, sets=offline, mode="resume", **run, **QUIET)
    assert not (root / "data" / "heldout").exists()
    assert json.loads((root / "metrics" / "eval.json").read_text()) == {"tasks": "offline"}
    # --overwrite --only 01 replaces notebook 01's products, the split included, and keeps the rest
    (root / "data" / "heldout" / "stale.txt").parent.mkdir(parents=True)
    (root / "data" / "heldout" / "stale.txt").write_text("an earlier split")
    run_pipeline(params, only=["01"], mode="overwrite", **run, **QUIET)
    assert sorted(p.name for p in (root / "data" / "heldout").iterdir()) == ["rows.txt"]
    assert (root / "checkpoints" / "step-000001").is_dir() and status(root)["04_eval_mteb_code"] == "stale"


def test_the_run_directory_knows_who_writes_and_reads_the_heldout_split(tmp_path):
    assert PRODUCERS["data/heldout"] == "01_data_prep"
    assert "data/heldout" in INPUTS["04_eval_mteb_code"] and "data/heldout" in INPUTS["05_pma_attention"]
    run = RunDir.open("r", tmp_path)
    assert run.optional_dataset("heldout") is None and run.drop_dataset("heldout") is False
    with pytest.raises(MissingInput, match="run 01_data_prep"):
        run.load_dataset("heldout")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the run's")
    (run.root / "data" / "heldout").symlink_to(outside)  # a link out of the run: removed, never followed
    assert run.drop_dataset("heldout") is True and (outside / "keep.txt").is_file()


@pytest.mark.slow
def test_notebook_01_saves_the_heldout_split_of_a_files_run(tmp_path):
    from c2llm_lib.config import FILES_INSTRUCTION
    from c2llm_lib.data.files import prepare_files
    from c2llm_lib.entries import file_entries

    params = tmp_path / "pairs.yaml"
    params.write_text(f"data_source: files\ndata_files: [{PAIRS}]\nrows_per_group: 16\nnum_negatives: 1\n")
    before = PAIRS.read_bytes(), PAIRS.stat().st_mtime_ns
    run = run_pipeline(params, only=["01"], outputs=tmp_path / "outputs", **QUIET)
    saved = load_from_disk(str(run.root / "data" / "heldout"))
    expected = prepare_files(file_entries([str(PAIRS)]), FILES_INSTRUCTION).heldout
    assert saved.to_list() == expected.to_list() and len(saved) == 8  # the fixture's held-out rows, with provenance
    data = json.loads((run.root / "metrics" / "data.json").read_text())
    assert data["heldout_rows"] == 8
    assert {(g["dataset"], g["language"], g["rows"]) for g in data["heldout_groups"]} == {
        ("own-pairs", "javascript", 7), ("own-pairs", "python", 1)}  # fmt: skip
    assert (PAIRS.read_bytes(), PAIRS.stat().st_mtime_ns) == before
    # the same run with nothing held out: notebook 01 drops the earlier split rather than leave it to be evaluated
    run_pipeline(params, only=["01"], sets={"files_heldout_fraction": 0.0}, mode="resume",
                 outputs=tmp_path / "outputs", **QUIET)  # fmt: skip
    assert not (run.root / "data" / "heldout").exists()
    assert "heldout_rows" not in json.loads((run.root / "metrics" / "data.json").read_text())
