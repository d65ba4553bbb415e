"""The recipe comparison's parts (study/plan.py, recipes.py): recipes over the run's compute, the dimension sweep,
the table and its sentences."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from c2llm_lib.checks import ConfigError
from c2llm_lib.config import ModelConfig, TrainConfig
from c2llm_lib.eval.scoring import truncation_query_scores
from c2llm_lib.retrieval import RetrievalTask
from c2llm_lib.study.plan import RECIPE_KEYS, load_recipe, plan, recipe_configs
from c2llm_lib.study.recipes import comparison_frame, comparison_markdown, dimension_table, verdict
from c2llm_lib.study.trainings import train_recipe

from test_eval_scoring import score_embeddings

BASE_MODEL = ModelConfig(backbone="tiny-random-qwen2", dtype="float32", max_length=64, pma_heads=4, use_lora=True)
BASE_TRAIN = TrainConfig(max_steps=3, global_batch_size=4, warmup_steps=1, max_length=64, seed=7, num_negatives=2,
                         checkpoint_steps=[1, 2])  # fmt: skip


def test_a_recipe_brings_its_choices_and_keeps_the_runs_compute():
    recipe = load_recipe("codexembed-style")
    assert set(recipe) <= set(RECIPE_KEYS) and "backbone" not in recipe and "global_batch_size" not in recipe
    model, train = recipe_configs(BASE_MODEL, BASE_TRAIN, recipe, [32, 16], "codexembed")
    assert (model.pooling, model.prompt_style, model.lora_r, model.lora_alpha) == ("last_token", "codexembed", 8, 16)
    assert (train.learning_rate, train.lr_schedule, train.min_lr_ratio, train.grad_cache) == (5e-5, "linear", 0.1, True)
    assert (model.backbone, model.max_length, model.pma_heads) == ("tiny-random-qwen2", 64, 4)  # the run's
    assert (train.max_steps, train.global_batch_size, train.seed, train.warmup_steps) == (3, 4, 7, 1)  # the run's
    assert train.checkpoint_steps == [] and not train.mrl_dims
    _, jina = recipe_configs(BASE_MODEL, BASE_TRAIN, load_recipe("jina-code-0.5b"), [16, 32], "jina")
    assert jina.mrl_dims == [32, 16] and jina.num_negatives == 0  # MRL at the compared widths; in-batch only
    c2llm, _ = recipe_configs(BASE_MODEL, BASE_TRAIN, {}, [16], "empty")  # unset recipe keys: the defaults
    assert (c2llm.pooling, c2llm.prompt_style, c2llm.lora_r) == ("pma", "c2llm", 64)
    with pytest.raises(ConfigError, match=r"compare_recipes: no params file .*nope\.yaml.*known: \["):
        load_recipe("nope")
    with pytest.raises(ConfigError, match="bad: parameter 'lora_r'"):
        recipe_configs(BASE_MODEL, BASE_TRAIN, {"lora_r": 0}, [16], "bad")


def test_the_plan_adds_pma_projections_only_for_pma_recipes():
    entries = plan(BASE_MODEL, BASE_TRAIN, ["c2llm-0.5b", "jina-code-0.5b"], [32, 16], [16])
    assert [e.label for e in entries] == ["c2llm-0.5b", "c2llm-0.5b, PMA d=16", "jina-code-0.5b"]
    projected = entries[1]
    assert projected.projected and projected.model.embedding_dim == 16 and projected.recipe == "c2llm-0.5b"
    assert dataclasses.replace(projected.model, embedding_dim=None) == entries[0].model


def truncation_scores(task, queries: np.ndarray, documents: np.ndarray, dims, k: int = 10) -> dict[int, float]:
    """{d: nDCG@k} with every embedding cut to its first d coordinates and re-normalised (`truncate`)."""
    return {
        d: float(np.mean(list(s.values())))
        for d, s in truncation_query_scores(task, queries, documents, dims, k).items()
    }


def test_truncation_scores_known_answer():
    task = RetrievalTask("t", {"q0": "a", "q1": "b"}, {"d0": "x", "d1": "y"}, {"q0": {"d0": 1}, "q1": {"d1": 1}}, "")
    queries = np.array([[1.0, 0.2], [1.0, -0.2]])
    docs = np.array([[1.0, 1.0], [1.0, -1.0]])
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    scores = truncation_scores(task, queries, docs, [2, 1])
    assert scores[2] == 1.0 == score_embeddings(task, unit(queries), unit(docs))["ndcg_at_10"]
    # at d = 1 both documents tie for both queries; the stable top-k puts d0 first, so q1 finds d1 second
    assert scores[1] == pytest.approx((1.0 + 1 / np.log2(3)) / 2)
    with pytest.raises(ValueError, match="cannot truncate 2-dimensional embeddings to \\[3\\]"):
        truncation_scores(task, queries, docs, [3])


def _results():
    train = {"tokens_per_second": 100.0, "peak_rss_gb": 2.0, "seconds": 10.0, "loss_first": 2.0, "loss_last": 1.0}
    return {
        "pma": {"recipe": "pma", "width": 64, "projected": False, "mrl": False, "training": train,
                "scores": {"64": {"a": 0.8, "b": 0.6}, "16": {"a": 0.5, "b": 0.3}}},
        "pma, PMA d=16": {"recipe": "pma", "width": 16, "projected": True, "mrl": False, "training": train,
                          "scores": {"16": {"a": 0.7, "b": 0.5}}},
        "mrl": {"recipe": "mrl", "width": 64, "projected": False, "mrl": True,
                "scores": {"64": {"a": 0.9, "b": 0.9}, "16": {"a": 0.8, "b": 0.8}},
                "training": {**train, "tokens_per_second": 50.0}},
    }  # fmt: skip


def test_the_table_the_curves_and_the_sentences():
    frame = comparison_frame(_results(), bm25={"a": 0.75, "b": 0.75})
    assert frame.loc["pma", "mean"] == 70.0 and frame.loc["pma, truncated to 16", "mean"] == 40.0
    assert (
        frame.loc["pma, PMA d=16", "curve"] == "pma: PMA projection"
        and frame.loc["mrl", "curve"] == "mrl: MRL truncation"
    )
    assert np.isnan(frame.loc["pma, truncated to 16", "tokens/s"])  # a truncation trains nothing
    dims = dimension_table(frame)
    assert list(dims.columns) == [64, 16]
    assert dims.loc["pma: PMA projection"].tolist() == [70.0, 60.0]  # starts at the recipe's full width
    assert dims.loc["pma: truncation"].tolist() == [70.0, 40.0] and dims.loc["mrl: MRL truncation"].tolist() == [
        90.0,
        80.0,
    ]
    text = verdict(frame, dims, ["a note"])
    assert "ranks mrl (90.0, d=64), then pma (70.0, d=64)." in text
    assert "BM25 scores 75.0; mrl beat it." in text
    assert "At d=16: mrl: MRL truncation 80.0, pma: PMA projection 60.0, pma: truncation 40.0." in text
    assert "pma: truncation: 70.0 at d=64, 40.0 at d=16 (-30.0)." in text
    assert (
        "Training throughput (real tokens/s): pma 100, pma, PMA d=16 100, mrl 50" in text and "Setting: a note." in text
    )
    table = comparison_markdown(frame, "t")
    assert "| pma, truncated to 16 | 16 | 40.0 | 50.0 | 30.0 |  |  |  |  |  |" in table
    assert "| pma | 64 | 70.0 | 80.0 | 60.0 | 100 | 2.00 | 10.0 | 2.00 | 1.00 |" in table
    assert "| BM25 |  | 75.0 |" in table


def test_a_failed_training_says_why(tmp_path):
    rows = tmp_path / "rows"
    from training_rows import make_rows

    make_rows().save_to_disk(str(rows))
    bad = dataclasses.replace(BASE_TRAIN, global_batch_size=64, checkpoint_steps=[])  # no group holds 64 rows
    with pytest.raises(
        RuntimeError, match=r"training failed \(exit 1\): ValueError: no global batch of 64 rows"
    ) as err:
        train_recipe(dataclasses.replace(BASE_MODEL, device="cpu"), bad, rows, tmp_path / "work")
    log = str(err.value).split("full log: ")[1]
    assert "Traceback" in open(log).read()


def test_the_comparison_parameters_are_checked():
    from c2llm_lib.config import CompareStage

    assert CompareStage().compare_recipes == []  # nothing is trained unless asked
    with pytest.raises(ConfigError, match=r"compare_pma_dims.*\[100\] must also be in compare_dims"):
        CompareStage(compare_dims=[128], compare_pma_dims=[100])
    with pytest.raises(ConfigError, match="compare_dims.*distinct positive"):
        CompareStage(compare_dims=[64, 64], compare_pma_dims=[])
    with pytest.raises(ConfigError, match="compare_recipes.*repeats"):
        CompareStage(compare_recipes=["jina-code-0.5b", "jina-code-0.5b"])


@pytest.mark.slow
def test_a_finished_training_is_reused_only_for_the_same_rows(tmp_path):
    """Notebook 06 reused a recipe's training made on other rows (issue 23): the folder is keyed by the rows too, and a
    folder whose recorded rows are not the ones given is moved aside and trained again, never read."""
    import json

    from datasets import load_from_disk

    from c2llm_lib.train import data_fingerprint

    from training_rows import make_rows

    first_rows, other_rows = tmp_path / "rows", tmp_path / "other-rows"
    make_rows().save_to_disk(str(first_rows))
    make_rows().map(lambda r: {"query": r["query"] + " (rewritten)"}).save_to_disk(str(other_rows))
    model = dataclasses.replace(BASE_MODEL, device="cpu")
    train = dataclasses.replace(BASE_TRAIN, max_steps=1, checkpoint_steps=[])
    work, lines = tmp_path / "work", []
    first = train_recipe(model, train, first_rows, work, log=lines.append)
    other = train_recipe(model, train, other_rows, work, log=lines.append)
    assert first["data_fingerprint"] == data_fingerprint(load_from_disk(str(first_rows)))
    assert other["data_fingerprint"] == data_fingerprint(load_from_disk(str(other_rows)))  # not the first's training
    lines.clear()
    reused = train_recipe(model, train, first_rows, work, log=lines.append)
    assert reused["final_checkpoint"] == first["final_checkpoint"]
    assert lines[0].startswith("reusing the finished training")  # the same rows and configs: reused
    summary = Path(first["final_checkpoint"]).parent / "train_summary.json"
    crafted = {**json.loads(summary.read_text()), "data_fingerprint": "0" * 24}  # a folder holding other rows' training
    summary.write_text(json.dumps(crafted))
    lines.clear()
    again = train_recipe(model, train, first_rows, work, log=lines.append)
    assert "trained on other rows (fingerprint 000000000000000000000000" in lines[0] and "moved it to" in lines[0]
    assert again["data_fingerprint"] == first["data_fingerprint"]
    moved = list(work.glob("*.other-rows-*"))
    assert len(moved) == 1 and json.loads((moved[0] / "checkpoints" / "train_summary.json").read_text()) == crafted
