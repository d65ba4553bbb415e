"""The papermill pipeline on params/smoke.yaml, and the runner's validation, resume and overwrite rules."""

import json
from pathlib import Path

import nbformat
import pytest
import yaml

from c2llm_lib.checks import ConfigError
from c2llm_lib.params import load_params, resolve
from c2llm_lib.pipeline import PipelineError, main, run_pipeline

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "params" / "smoke.yaml"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    outputs = tmp_path_factory.mktemp("outputs")
    return run_pipeline(SMOKE, outputs=outputs, log=lambda *_: None), outputs


@pytest.mark.slow
def test_the_whole_pipeline_on_the_smoke_params(smoke_run):
    run, _ = smoke_run
    for name in ("01_data_prep", "02_train_lora_contrastive", "03_merge_checkpoints", "04_eval_mteb_code",
                 "05_pma_attention", "06_recipe_comparison"):  # fmt: skip
        nb = nbformat.read(run.root / "notebooks" / f"{name}.ipynb", as_version=4)
        assert nb.metadata.papermill["exception"] is None, name
        assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    for metric in ("data", "train", "merge", "eval", "attention"):
        assert (run.root / "metrics" / f"{metric}.json").is_file(), metric
    for figure in ("data_lengths", "loss", "scores", "attention_0"):
        assert (run.root / "figures" / f"{figure}.png").stat().st_size > 1000, figure
    assert sorted(p.name for p in (run.root / "checkpoints").iterdir()) == ["step-000002", "step-000003", "step-000004"]
    assert (run.root / "merged" / "c2llm_config.json").is_file()
    params = yaml.safe_load(SMOKE.read_text())
    export = run.root / "export"  # at the length notebook 04 scored (128), not the training length (64)
    assert json.loads((export / "c2llm_backbone.json").read_text())["max_seq_length"] == params["eval_max_length"]
    assert params["max_length"] != params["eval_max_length"]
    card = (export / "README.md").read_text()
    assert "| C2LLM recipe (merged) |" in card and "These are the scores of this folder's model" in card  # float32
    assert f"at max length {params['eval_max_length']} tokens" in card
    assert json.loads((run.root / "metrics" / "merge.json").read_text())["forms_min_cosine"] >= 0.995
    manifest = json.loads((run.root / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["git"]["sha"] and manifest["versions"]["torch"]
    assert "started" in manifest and "ended" in manifest and "device" in manifest
    assert (run.root / "params.yaml").is_file() and (run.root / "resolved.yaml").is_file()
    scores = json.loads((run.root / "metrics" / "eval.json").read_text())
    assert all(0 <= v <= 1 for model in scores.values() for v in model.values())
    assert list((run.root / "mteb").rglob("*.json"))  # mteb's own result cache
    assert "| C2LLM recipe (merged) |" in (run.root / "metrics" / "results.md").read_text()
    study = json.loads((run.root / "metrics" / "pooling_study.json").read_text())  # smoke.yaml asks for the study
    assert set(study["poolers"]) == {"PMA", "last token", "mean"} and "PMA d=16" in study["models"]
    dims = study["dimensions"]  # PMA projected to 16, and the full PMA truncated to 32 and 16
    assert dims["16"]["PMA projection"] is not None and dims["32"]["truncation"] is not None
    assert (
        dims["16"]["truncation"] is not None
        and "95 % interval" in (run.root / "metrics" / "pooling_study.md").read_text()
    )
    assert (run.root / "figures" / "pooling_study.png").is_file()
    attention = json.loads((run.root / "metrics" / "attention.json").read_text())
    assert abs(sum(attention["category_shares"]["trained head"].values()) - 1) < 1e-4


@pytest.mark.slow
def test_the_recipe_comparison_on_the_smoke_params(smoke_run):
    """Notebook 06 trained the three recipes (and C2LLM's PMA at d = 16) and wrote its table, figure and outcome."""
    run, _ = smoke_run
    table = (run.root / "metrics" / "comparison.md").read_text()
    for row in ("c2llm-0.5b", "jina-code-0.5b", "codexembed-style", "c2llm-0.5b, PMA d=16",
                "jina-code-0.5b, truncated to 16", "c2llm-0.5b, truncated to 32", "BM25"):  # fmt: skip
        assert f"| {row} |" in table, row
    assert "At full width, mean nDCG@10 ranks" in table and "Training throughput" in table
    assert "Training loss, mean of the first and the last 5 steps: c2llm-0.5b " in table
    assert (run.root / "figures" / "comparison.png").stat().st_size > 1000
    result = json.loads((run.root / "metrics" / "comparison.json").read_text())
    trained = {r["model"]: r for r in result["table"] if r["tokens/s"] is not None}
    assert set(trained) == {"c2llm-0.5b", "jina-code-0.5b", "codexembed-style", "c2llm-0.5b, PMA d=16"}
    assert all(r["tokens/s"] > 0 and r["peak memory GB"] > 0 for r in trained.values())
    assert set(result["dimensions"]) == {"c2llm-0.5b: truncation", "c2llm-0.5b: PMA projection",
                                         "jina-code-0.5b: MRL truncation", "codexembed-style: truncation"}  # fmt: skip
    configs = [yaml.safe_load(p.read_text()) for p in (run.root / "comparison").glob("*/params.yaml")]
    by_style = {c["prompt_style"]: c for c in configs if c.get("embedding_dim") is None}
    assert by_style["jina"]["mrl_dims"] == [32, 16] and by_style["jina"]["num_negatives"] == 0
    assert by_style["codexembed"]["lora_r"] == 8 and by_style["codexembed"]["grad_cache"]
    same = ("backbone", "max_steps", "global_batch_size", "max_length", "seed", "warmup_steps")
    assert all(c[k] == configs[0][k] for c in configs for k in same)  # equal data and compute


@pytest.mark.slow
def test_a_run_is_never_overwritten_unless_asked(smoke_run):
    run, outputs = smoke_run
    with pytest.raises(FileExistsError, match="--resume.*--overwrite"):
        run_pipeline(SMOKE, outputs=outputs, log=lambda *_: None)
    lines = []
    run_pipeline(SMOKE, outputs=outputs, mode="resume", log=lines.append)
    assert all("kept" in line for line in lines) and len(lines) == 6  # nothing reran
    lines.clear()
    run_pipeline(SMOKE, outputs=outputs, mode="resume", sets={"eval_limit": 4}, only=["04"], log=lines.append)
    assert lines[0].startswith("[04_eval_mteb_code] running")  # its parameters changed: it reruns


def test_overwrite_and_a_missing_upstream_product(tmp_path):
    (tmp_path / "smoke" / "merged").mkdir(parents=True)
    (tmp_path / "smoke" / "merged" / "old.safetensors").write_text("an earlier merge")
    (tmp_path / "smoke" / "mine.txt").write_text("mine")
    (tmp_path / "smoke" / "manifest.json").write_text("{}")  # a run: --overwrite deletes only in a run's folder
    with pytest.raises(PipelineError, match=r"03_merge_checkpoints failed.*run 02_train_lora_contrastive"):
        run_pipeline(SMOKE, outputs=tmp_path, mode="overwrite", only=["03"], log=lambda *_: None)
    assert not (tmp_path / "smoke" / "merged" / "old.safetensors").exists()  # 03's product: replaced, as asked
    assert (tmp_path / "smoke" / "mine.txt").read_text() == "mine"  # not 03's: --only keeps it
    assert (tmp_path / "smoke" / "notebooks" / "03_merge_checkpoints.ipynb").is_file()  # saved with its error
    manifest = json.loads((tmp_path / "smoke" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["failed_notebook"] == "03_merge_checkpoints"


def test_bad_params_are_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_steps: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml: does not parse as YAML"):
        load_params(bad)
    with pytest.raises(
        ConfigError, match=r"p.yaml: no notebook declares 'lerning_rate' \(did you mean 'learning_rate'\?\)"
    ):
        resolve({"lerning_rate": 1e-4}, "p.yaml")
    with pytest.raises(
        ConfigError, match=r"p.yaml \(notebook 02_train_lora_contrastive\): parameter 'max_steps' must be"
    ):
        resolve({"max_steps": "ten"}, "p.yaml")
    with pytest.raises(ConfigError, match="set by the runner"):
        resolve({"run": "other"}, "p.yaml")
    with pytest.raises(ConfigError, match="merge_weights"):
        resolve({"merge_last": 2, "merge_weights": [1.0]}, "p.yaml")
    assert main([str(tmp_path / "missing.yaml")]) == 1


@pytest.mark.slow
def test_a_peer_recipe_runs_through_the_pipeline(tmp_path):
    """A jina-style model (last token, task prefixes, MRL, in-batch only, linear decay) trains, merges and is
    evaluated by notebooks 01-04; notebook 05 refuses it by name, since it has no PMA attention."""
    peer = {"pooling": "last_token", "prompt_style": "jina", "mrl_dims": [32, 16], "num_negatives": 0,
            "lr_schedule": "linear", "compare_recipes": [], "compare_poolings": []}  # fmt: skip
    run = run_pipeline(SMOKE, outputs=tmp_path, sets=peer, only=["01", "02", "03", "04"], log=lambda *_: None)
    train = json.loads((run.root / "metrics" / "train.json").read_text())
    assert train["model_config"]["prompt_style"] == "jina" and "loss@16" in train["log"][0]
    scores = json.loads((run.root / "metrics" / "eval.json").read_text())
    assert all(0 <= v <= 1 for v in scores["C2LLM recipe (merged)"].values())
    with pytest.raises(PipelineError, match="05_pma_attention failed.*pooling='pma'; this model pools by 'last_token'"):
        run_pipeline(SMOKE, outputs=tmp_path, sets=peer, only=["05"], mode="resume", log=lambda *_: None)


SLOW_KERNEL_INFO = """import time

kernel = get_ipython().kernel
answer = kernel.shell_handlers["kernel_info_request"]


async def answer_then_linger(*args):  # papermill asks for the kernel's info after the last cell, then shuts it down
    await answer(*args)
    time.sleep(5)  # still in the handler when the interrupt of the shutdown lands, as on a busy CPU


kernel.shell_handlers["kernel_info_request"] = answer_then_linger
kernel.log.error("a real kernel error stays visible")"""


def test_a_finished_notebook_ends_without_an_error_line_from_its_kernel(tmp_path, capfd):
    """jupyter_client interrupts a kernel before shutting it down; landing in a request handler, the interrupt made
    ipykernel log "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel." at the end of a successful run."""
    from c2llm_lib.notebook import NOTEBOOK_DIR, STAGES, parameters_cell

    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for name in STAGES:
        nb = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
        nb.cells = [
            nb.cells[parameters_cell(NOTEBOOK_DIR / f"{name}.ipynb")[0]],
            nbformat.v4.new_code_cell(SLOW_KERNEL_INFO),
        ]
        nbformat.write(nb, notebooks / f"{name}.ipynb")
    (tmp_path / "quiet.yaml").write_text("seed: 0\n")
    capfd.readouterr()
    run = run_pipeline(tmp_path / "quiet.yaml", only=["01"], outputs=tmp_path / "outputs", notebook_dir=notebooks,
                       log=lambda *_: None)  # fmt: skip
    out, err = capfd.readouterr()
    assert json.loads((run.root / "manifest.json").read_text())["status"] == "finished"
    assert "KeyboardInterrupt caught in kernel" not in out + err, err
    assert "a real kernel error stays visible" in err  # the kernel's other errors are still shown
    executed = nbformat.read(run.root / "notebooks" / "01_data_prep.ipynb", as_version=4)
    assert [c.execution_count for c in executed.cells if c.cell_type == "code"] == [1, 2, 3]  # nothing ran before
