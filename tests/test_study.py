"""The pooling study's parts (notebook 06): the validation split, the sweep's choice, which trainings are reused, the
cached scores, and the tables and sentences built from per-query scores."""

import dataclasses
import json

import numpy as np
import pytest

from c2llm_lib.checks import ConfigError
from c2llm_lib.config import CompareStage, ModelConfig, TrainConfig
from c2llm_lib.data.offline import load_snapshot, split_of
from c2llm_lib.data.records import text_key
from c2llm_lib.study.plan import Entry, plan, pooling_entries
from c2llm_lib.study.recipes import recipe_pairs
from c2llm_lib.study.sweep import Grid, SweepPoint, SweepResult, choose, points, rates, sweep
from c2llm_lib.study.trainings import config_key, evaluation_key, final_trainings, over_seeds, query_rows
from c2llm_lib.study.validation import in_validation, validation_split

BASE_MODEL = ModelConfig(backbone="tiny-random-qwen2", dtype="float32", max_length=64, pma_heads=4, use_lora=True)
BASE_TRAIN = TrainConfig(max_steps=3, global_batch_size=4, warmup_steps=1, max_length=64, seed=0, num_negatives=1,
                         checkpoint_steps=[1, 2], pma_learning_rate=1e-3, pma_attention_learning_rate=3e-3)  # fmt: skip
GRID = Grid([1e-4, 1e-3], [1e-3], [1e-3, 3e-3])


def snapshot_rows(n: int = 400):
    from datasets import Dataset

    rows = [r for r in load_snapshot() if r["split"] == "train"][::7][:n]
    keep = ("dataset", "language", "query", "positive", "negatives", "instruction")
    return Dataset.from_list([{k: r[k] for k in keep} for r in rows])


def test_the_validation_split_is_disjoint_from_training_and_test_by_file():
    rows = snapshot_rows()
    split = validation_split(rows, 15, limit=None, max_documents=None)
    assert split.rule == "file"
    files = {(r["dataset"], text_key(r["query"]), text_key(r["positive"])): r["file"] for r in load_snapshot()}
    file_of = lambda r: files[(r["dataset"], text_key(r["query"]), text_key(r["positive"]))]  # noqa: E731
    trained = {file_of(r) for r in split.rows}
    validated = {file_of({"dataset": split.datasets[t.name], "query": q, "positive": t.corpus[next(iter(t.qrels[i]))]})
                 for t in split.tasks for i, q in t.queries.items()}  # fmt: skip
    assert validated and trained and not trained & validated  # no file on both sides
    assert all(split_of(f) == "train" for f in validated)  # the test split's files never validate
    assert all(in_validation(f, 15) for f in validated) and not any(in_validation(f, 15) for f in trained)
    texts = {text_key(x) for t in split.tasks for x in (*t.queries.values(), *t.corpus.values())}
    assert not any(text_key(r["query"]) in texts or text_key(r["positive"]) in texts for r in split.rows)
    assert split.dropped["validation files"] + split.dropped["text shared with validation"] + len(split.rows) == len(
        rows
    )
    names = {t.name for t in split.tasks}
    assert names == {"validation-text2code-python", "validation-code2code-python", "validation-text2code-javascript",
                     "validation-code2code-javascript"}  # fmt: skip
    again = validation_split(rows, 15)
    assert again.rows["query"] == split.rows["query"] and [t.queries for t in again.tasks] == [
        t.queries for t in split.tasks
    ]  # stable


def test_other_data_is_split_by_query_and_bad_shares_are_named():
    from training_rows import make_rows

    rows = make_rows()
    split = validation_split(rows, 40)
    assert split.rule == "query"
    held = {q for t in split.tasks for q in t.queries.values()}
    assert held and not held & set(split.rows["query"])
    assert split.prompts(BASE_MODEL, split.tasks[0]) == ("Find the code:", "Retrieved Answer:")  # the rows' own
    with pytest.raises(ValueError, match="validation_percent must be from 1 to 50"):
        validation_split(rows, 0)
    with pytest.raises(ValueError, match="none of the 16 training distinct queries falls in the validation share"):
        validation_split(rows, 1)
    held_out = next(f"query {i}" for i in range(100) if in_validation(text_key(f"query {i}"), 50))
    with pytest.raises(ValueError, match="every training row is a validation query or shares its text"):
        validation_split(rows.map(lambda r: {"query": held_out}), 50)


def test_the_sweep_picks_the_best_validation_score():
    scores = {1e-4: 0.2, 1e-3: 0.5}
    seen = []

    def stub(model, train):  # a stub trainer and evaluator: the score is a known function of the rates
        seen.append(rates(train, model))
        bonus = 0.1 if train.pma_attention_learning_rate == 3e-3 else 0.0
        per_task = {"a": scores[train.learning_rate] + bonus, "b": scores[train.learning_rate]}
        return per_task, f"folder-{len(seen)}", {"train s": 1.0}

    found, chosen = sweep(BASE_MODEL, BASE_TRAIN, GRID, stub)
    assert len(found.points) == 4 and len(seen) == 4
    assert (chosen.learning_rate, chosen.pma_learning_rate, chosen.pma_attention_learning_rate) == (1e-3, 1e-3, 3e-3)
    assert found.best.score == pytest.approx(0.55) and found.best.folder == "folder-4"
    last, _ = sweep(dataclasses.replace(BASE_MODEL, pooling="mean"), BASE_TRAIN, GRID, stub)
    assert [p.rates for p in last.points] == [{"learning_rate": 1e-4}, {"learning_rate": 1e-3}]  # no head to tune
    assert choose([0.1, 0.3, 0.3]) == 1  # ties: the first in grid order
    with pytest.raises(ValueError, match="not a number"):
        choose([0.1, float("nan")])
    assert len(points(BASE_MODEL, BASE_TRAIN, Grid([1e-4, 3e-4, 1e-3], [1e-3], [1e-3, 3e-3]))) == 6


def test_projections_train_at_their_full_widths_rates_and_no_test_training_is_the_sweeps():
    entries = pooling_entries(BASE_MODEL, BASE_TRAIN, ["pma", "mean"], [16])
    assert [e.label for e in entries] == ["PMA", "PMA d=16", "mean"]
    assert entries[1].parent == "PMA" and entries[1].model.embedding_dim == 16 and entries[1].projected
    assert entries[2].train.pma_learning_rate is None  # mean pooling has no head
    picked = {"PMA": dataclasses.replace(BASE_TRAIN, learning_rate=1e-3, pma_attention_learning_rate=1e-3),
              "mean": dataclasses.replace(BASE_TRAIN, learning_rate=3e-4, pma_learning_rate=None,
                                          pma_attention_learning_rate=None)}  # fmt: skip
    chosen = {label: (None, dataclasses.replace(t, seed=100, checkpoint_steps=[])) for label, t in picked.items()}
    planned = final_trainings(entries, [0, 1], chosen)
    assert [(e.label, s) for e, s, _ in planned] == [("PMA", 0), ("PMA", 1), ("PMA d=16", 0), ("PMA d=16", 1),
                                                     ("mean", 0), ("mean", 1)]  # fmt: skip
    by = {(e.label, s): t for e, s, t in planned}
    assert by["PMA d=16", 1].learning_rate == 1e-3 and by["PMA d=16", 1].pma_attention_learning_rate == 1e-3
    assert by["mean", 0].learning_rate == 3e-4 and by["mean", 1].seed == 1
    # the sweep trained at its own seed (100): no compared seed's training is the one chosen on validation
    for seed in (0, 1):
        assert config_key(entries[0].model, by["PMA", seed], "rows") != config_key(entries[0].model,
                                                                                  chosen["PMA"][1], "rows")  # fmt: skip
    assert config_key(entries[0].model, by["PMA", 1], "rows") != config_key(entries[0].model, by["PMA", 0], "rows")
    unswept = final_trainings(entries[:1], [3])
    assert unswept[0][2] == dataclasses.replace(entries[0].train, seed=3)


def test_the_comparison_seeds_are_never_the_sweeps():
    from c2llm_lib.study.plan import study_seeds

    assert study_seeds(CompareStage(compare_seeds=[0, 1, 2], compare_sweep=True), BASE_TRAIN) == [0, 1, 2]
    assert study_seeds(CompareStage(compare_sweep=True), BASE_TRAIN) == [0]  # notebook 02's seed
    with pytest.raises(ConfigError, match=r"sweep_seed: 100 is also a comparison seed \(notebook 02's seed"):
        study_seeds(CompareStage(compare_sweep=True), dataclasses.replace(BASE_TRAIN, seed=100))
    assert study_seeds(CompareStage(), dataclasses.replace(BASE_TRAIN, seed=100)) == [100]  # no sweep


def test_a_selected_training_is_refused_for_a_test_score(tmp_path, monkeypatch):
    from c2llm_lib.runs import RunDir
    from c2llm_lib.study import trainings

    from training_rows import make_rows

    run = RunDir.open("study", tmp_path)
    rows_dir = run.save_rows("comparison/rows-1", make_rows())
    setup = trainings.Setup(run, rows_dir, run.root / "comparison", log=lambda *_: None)
    entry = pooling_entries(BASE_MODEL, BASE_TRAIN, ["mean"], [])[0]
    train = dataclasses.replace(entry.train, seed=0)
    chosen_folder = trainings.training_folder(entry.model, train, rows_dir, setup.work_dir)[1]
    monkeypatch.setattr(trainings, "scored_training", lambda *a, **k: {"folder": "fresh"})
    with pytest.raises(RuntimeError, match="mean, seed 0: its training .* is one the sweep ran"):
        trainings.score_trainings([(entry, 0, train)], setup, [], [], selected={str(chosen_folder)})
    found = trainings.score_trainings([(entry, 1, dataclasses.replace(train, seed=1))], setup, [], [],
                                       selected={str(chosen_folder)})  # fmt: skip
    assert found == {"mean": {1: {"folder": "fresh"}}}
    sweep = SweepResult([SweepPoint({"learning_rate": 1e-3}, 0.5, {"t": 0.5}, "a"),
                         SweepPoint({"learning_rate": 3e-3}, 0.4, {"t": 0.4}, "b")], 0)  # fmt: skip
    assert trainings.sweep_folders({"mean": (sweep, train)}) == {"a", "b"} and trainings.sweep_folders(None) == set()


def test_a_training_and_its_scores_are_keyed_by_the_dtype_auto_resolved_to(monkeypatch, tmp_path):
    import torch

    from c2llm_lib import hardware

    auto = dataclasses.replace(BASE_MODEL, dtype="auto")
    monkeypatch.setattr(hardware, "auto_dtype", lambda device: (torch.bfloat16, "probe said bf16"))
    as_bf16 = config_key(auto, BASE_TRAIN, "rows")
    monkeypatch.setattr(hardware, "auto_dtype", lambda device: (torch.float32, "probe said fp32"))
    assert config_key(auto, BASE_TRAIN, "rows") != as_bf16  # a re-made probe never reuses the other dtype's training
    assert config_key(auto, BASE_TRAIN, "rows", {"device": "cpu", "dtype": "bfloat16"}) == as_bf16
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "train_summary.json").write_text('{"steps": 3}')
    bf16, fp32 = {"device": "cpu", "dtype": "bfloat16"}, {"device": "cpu", "dtype": "float32"}
    assert evaluation_key([], {}, [16], 8, 64, checkpoints, bf16) != evaluation_key([], {}, [16], 8, 64, checkpoints,
                                                                                    fp32)  # fmt: skip


def test_a_training_is_reused_only_for_equal_model_training_and_rows():
    key = config_key(BASE_MODEL, BASE_TRAIN, "rows-a")
    assert key == config_key(dataclasses.replace(BASE_MODEL), dataclasses.replace(BASE_TRAIN), "rows-a")
    assert key != config_key(dataclasses.replace(BASE_MODEL, pooling="mean"), BASE_TRAIN, "rows-a")
    assert key != config_key(BASE_MODEL, dataclasses.replace(BASE_TRAIN, learning_rate=3e-4), "rows-a")
    assert key != config_key(BASE_MODEL, dataclasses.replace(BASE_TRAIN, seed=1), "rows-a")
    assert key != config_key(BASE_MODEL, BASE_TRAIN, "rows-b")


def test_cached_scores_are_keyed_by_tasks_widths_length_and_training(tmp_path):
    from c2llm_lib.eval.tasks import offline_tasks

    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "train_summary.json").write_text('{"steps": 3}')
    tasks = offline_tasks(limit=4, include_humaneval=False, max_documents=20)
    cpu = {"device": "cpu", "dtype": "float32"}
    key = evaluation_key(tasks, {}, [16], 8, 64, checkpoints, cpu)
    assert key == evaluation_key(tasks, {}, [16], 8, 64, checkpoints, cpu)
    assert key != evaluation_key(offline_tasks(limit=5, include_humaneval=False, max_documents=20), {}, [16], 8, 64,
                                 checkpoints, cpu)  # fmt: skip
    assert key != evaluation_key(tasks, {}, [32], 8, 64, checkpoints, cpu)
    assert key != evaluation_key(tasks, {}, [16], 8, 128, checkpoints, cpu)
    assert key != evaluation_key(tasks, {}, [16], 4, 64, checkpoints, cpu)
    assert key != evaluation_key(tasks, {"t": ["other instruction", ""]}, [16], 8, 64, checkpoints, cpu)
    (checkpoints / "train_summary.json").write_text('{"steps": 4}')  # retrained
    assert key != evaluation_key(tasks, {}, [16], 8, 64, checkpoints, cpu)


def per_query(values: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {t: {f"q{i}": v for i, v in enumerate(vs)} for t, vs in values.items()}


def result(entry: Entry, seeds: dict[int, dict[str, dict[str, list[float]]]], width: int, seconds: float = 10.0):
    """`over_seeds` of made-up per-query scores: {seed: {str(d): {task: [scores]}}}."""
    per_seed = {}
    for seed, by_dim in seeds.items():
        queries = {d: per_query(v) for d, v in by_dim.items()}
        per_seed[seed] = {"width": width, "queries": queries,
                          "scores": {d: {t: float(np.mean(list(q.values()))) for t, q in by_t.items()}
                                     for d, by_t in queries.items()},
                          "training": {"tokens_per_second": 100.0, "train_seconds": 5.0},
                          "encode": {"seconds": seconds, "tokens": 1000,
                                     "tokens_per_second": 1000 / seconds}}  # fmt: skip
    return over_seeds(entry, per_seed)


def study_results():
    entries = pooling_entries(BASE_MODEL, BASE_TRAIN, ["pma", "last_token"], [16])
    pma, projected, last = entries
    high, low = [1.0] * 20 + [0.0] * 20, [0.0] * 40
    results = {
        "PMA": result(pma, {0: {"64": {"t": high}, "16": {"t": [0.5] * 40}},
                            1: {"64": {"t": high[::-1]}, "16": {"t": [0.5] * 40}}}, 64, seconds=10.0),
        "PMA d=16": result(projected, {0: {"16": {"t": [0.5] * 40}}, 1: {"16": {"t": [0.5] * 40}}}, 16),
        "last token": result(last, {0: {"64": {"t": low}, "16": {"t": low}}, 1: {"64": {"t": low}, "16": {"t": low}}},
                             64, seconds=9.0),
    }  # fmt: skip
    return entries, results


def test_the_study_tables_and_sentences_are_built_from_the_numbers():
    from c2llm_lib.eval.intervals import MEAN, differences
    from c2llm_lib.study.pooling import (
        dimension_frame,
        mean_intervals,
        overhead,
        pooling_frame,
        study_pairs,
        study_sentences,
    )

    entries, results = study_results()
    assert results["PMA"]["queries"]["64"]["t"]["q0"] == 0.5  # seed 0 scored 1, seed 1 scored 0: the mean
    assert results["PMA"]["seeds"] == {"0": {"64": {"t": 0.5}, "16": {"t": 0.5}},
                                       "1": {"64": {"t": 0.5}, "16": {"t": 0.5}}}  # fmt: skip
    pairs = study_pairs(entries)
    assert pairs == [("PMA", "last token"), ("PMA d=16", "PMA, truncated to 16")]
    diffs = differences(query_rows(results), pairs)
    assert diffs["PMA", "last token"][MEAN].value == pytest.approx(0.5)
    assert diffs["PMA", "last token"][MEAN].low == pytest.approx(0.5)  # every query's seed mean is 0.5 above
    assert diffs["PMA d=16", "PMA, truncated to 16"][MEAN].within_noise  # equal
    frame = pooling_frame(results)
    assert frame.loc["PMA", "mean"] == 50.0 and frame.loc["last token", "seed 1"] == 0.0
    assert frame.loc["PMA", "encode tokens/s"] == 100.0
    dims = dimension_frame(results)
    assert list(dims.index) == [64, 16]
    assert dims.loc[16, "PMA projection"] == 50.0 and dims.loc[16, "truncation"] == 50.0
    assert dims.loc[64, "PMA projection"] == dims.loc[64, "truncation"] == 50.0  # full width: both are PMA
    text = study_sentences(frame, dims, diffs, overhead(results), [0, 1])
    assert "PMA - last token = +50.0 (95 % interval [+50.0, +50.0] over 40 queries): PMA is ahead." in text
    assert "PMA d=16 - PMA, truncated to 16 = +0.0" in text and "within noise." in text
    assert "Encoding throughput in the test evaluation: PMA 100 real tokens/s, last token 111 (-10 %)" in text
    from c2llm_lib.study.pooling import study_markdown

    setting = {"cpu": {"model": "a CPU", "capabilities": ["avx2"], "threads": 2}, "device": "cpu", "dtype": "float32",
               "backbone": "tiny", "steps": 3, "global_batch_size": 4, "num_negatives": 1, "max_length": 64,
               "seeds": [0, 1], "timed seconds": 120.0, "grid": dataclasses.asdict(GRID)}  # fmt: skip
    swept = {"PMA": (SweepResult([SweepPoint({"learning_rate": 1e-3, "pma_learning_rate": 1e-3,
                                              "pma_attention_learning_rate": 1e-3}, 0.5, {"t": 0.5}, "f")], 0),
                     BASE_TRAIN)}  # fmt: skip
    page = study_markdown("study", frame, dims, diffs, text, setting, swept)
    assert "Machine: a CPU (avx2), 2 threads, cpu, float32." in page
    assert "Timed trainings and evaluations: 2 min." in page
    assert "| PMA | LoRA 1e-03, head 1e-03, attention 1e-03 | 50.0 | 50.0 | **yes** |" in page
    assert (
        "- PMA: its LoRA rate 1e-03 is the grid's largest and its attention-logit rate 1e-03 is the grid's "
        "smallest, so rates beyond them may score better"
    ) in page
    assert page.endswith(text + "\n")
    bars = mean_intervals(results)
    assert set(bars) == {"poolers", "PMA projection", "truncation"} and bars["poolers"]["PMA"].value == 50.0
    assert sorted(bars["PMA projection"]) == [16, 64] and sorted(bars["truncation"]) == [16, 64]


def test_the_recipe_table_states_its_differences(tmp_path):
    from c2llm_lib.eval.intervals import differences, task_means
    from c2llm_lib.study.recipes import comparison_frame, dimension_table, verdict

    entries = plan(BASE_MODEL, BASE_TRAIN, ["c2llm-0.5b", "codexembed-style"], [16], [16])
    assert recipe_pairs(entries) == [("c2llm-0.5b", "codexembed-style"), ("c2llm-0.5b", "BM25"),
                                     ("c2llm-0.5b, PMA d=16", "c2llm-0.5b, truncated to 16")]  # fmt: skip
    results = {e.label: result(e, {0: {str(e.model.embedding_dim or 64): {"t": [0.5] * 40},
                                       **({} if e.projected else {"16": {"t": [0.25] * 40}})}},
                               e.model.embedding_dim or 64) for e in entries}  # fmt: skip
    bm25 = per_query({"t": [0.5] * 40})
    frame = comparison_frame(results, task_means(bm25))
    diffs = differences(query_rows(results, bm25), recipe_pairs(entries))
    text = verdict(frame, dimension_table(frame), ["a note"], diffs)
    assert "c2llm-0.5b - BM25 = +0.0 (95 % interval [+0.0, +0.0] over 40 queries): within noise." in text
    assert "c2llm-0.5b, PMA d=16 - c2llm-0.5b, truncated to 16 = +25.0" in text


def test_the_study_parameters_are_checked():
    assert CompareStage().compare_poolings == [] and not CompareStage().compare_sweep  # nothing runs unless asked
    with pytest.raises(ConfigError, match=r"compare_poolings.*distinct poolers among"):
        CompareStage(compare_poolings=["pma", "cls"])
    with pytest.raises(ConfigError, match="compare_seeds.*repeats a seed"):
        CompareStage(compare_seeds=[0, 0])
    with pytest.raises(ConfigError, match="sweep_learning_rates.*distinct positive"):
        CompareStage(sweep_learning_rates=[])
    with pytest.raises(ConfigError, match="validation_percent.*from 1 to 50"):
        CompareStage(validation_percent=0)
    with pytest.raises(ConfigError, match="eval_max_documents.*at least 200"):
        CompareStage(eval_max_documents=100)
    with pytest.raises(ConfigError, match="'sweep_seed' 1 is also in compare_seeds"):
        CompareStage(compare_seeds=[0, 1], compare_sweep=True, sweep_seed=1)
    assert CompareStage(compare_seeds=[0, 1], compare_sweep=False, sweep_seed=1).sweep_seed == 1  # no sweep: unused
    with pytest.raises(ConfigError, match="compare_poolings: unknown poolers"):
        pooling_entries(BASE_MODEL, BASE_TRAIN, ["cls"], [])


def test_a_sweep_result_records_its_choice():
    found = SweepResult([SweepPoint({"learning_rate": 1e-4}, 0.1, {"t": 0.1}, "a"),
                         SweepPoint({"learning_rate": 1e-3}, 0.3, {"t": 0.3}, "b")], 1)  # fmt: skip
    record = json.loads(json.dumps(found.to_dict()))
    assert record["chosen"] == 1 and record["chosen_rates"] == {"learning_rate": 1e-3}


def test_a_choice_at_an_end_of_the_grid_is_said():
    from c2llm_lib.study.sweep import edge_sentences, edges

    grid = Grid([1e-4, 3e-4, 1e-3], [1e-3], [1e-3, 3e-3])
    pma = {"learning_rate": 1e-3, "pma_learning_rate": 1e-3, "pma_attention_learning_rate": 3e-3}
    assert edges(pma, grid) == {"learning_rate": "largest", "pma_attention_learning_rate": "largest"}  # the head's
    # axis has one value: no end
    assert edges({"learning_rate": 3e-4}, grid) == {} and edges({"learning_rate": 1e-4}, grid) == {
        "learning_rate": "smallest"
    }

    def one(rates):
        return SweepResult([SweepPoint(rates, 0.5, {"t": 0.5}, "f")], 0), BASE_TRAIN

    sweeps = {"PMA": one(pma), "mean": one({"learning_rate": 3e-4}), "last token": one({"learning_rate": 1e-4})}
    lines = edge_sentences(sweeps, grid)
    assert lines == [
        "PMA: its LoRA rate 1e-03 is the grid's largest and its attention-logit rate 3e-03 is the grid's largest, so "
        "rates beyond them may score better; the sweep bounds the best rate from one side and does not find it.",
        "last token: its LoRA rate 1e-04 is the grid's smallest, so a rate below it may score better; the sweep bounds "
        "the best rate from one side and does not find it.",
    ]


def test_cached_scores_are_read_back_and_a_crafted_one_is_named(tmp_path, monkeypatch):
    from c2llm_lib.eval import offline_tasks
    from c2llm_lib.files import CorruptFile
    from c2llm_lib.runs import RunDir
    from c2llm_lib.study import trainings

    run = RunDir.open("study", tmp_path)
    folder = run.root / "comparison" / "abc"
    (folder / "checkpoints" / "step-000003").mkdir(parents=True)
    (folder / "checkpoints" / "train_summary.json").write_text('{"steps": 3}')
    summary = {"final_checkpoint": str(folder / "checkpoints" / "step-000003"), "train_seconds": 1.0}
    monkeypatch.setattr(trainings, "train_recipe", lambda *args, **kwargs: summary)  # a finished training

    def no_encoding(*args, **kwargs):
        raise AssertionError("scores already kept were computed again")

    monkeypatch.setattr("c2llm_lib.study.trainings.encoder_from_checkpoint", no_encoding)
    setup = trainings.Setup(run, tmp_path / "rows", run.root / "comparison", 8, 64, log=lambda *_: None)
    tasks = offline_tasks(limit=2, include_humaneval=False, max_documents=10)
    key = evaluation_key(tasks, {t.name: None for t in tasks}, [16], 8, 64, folder / "checkpoints",
                         trainings.resolved_compute(BASE_MODEL))  # fmt: skip
    kept = {"width": 64, "scores": {"64": {"t": 0.5}}, "queries": {"64": {"t": {"q0": 0.5}}}, "encode": {"seconds": 1}}
    run.save_json(f"comparison/abc/scores-{key}.json", kept)
    found = trainings.scored_training(setup, BASE_MODEL, BASE_TRAIN, tasks, [16])
    assert found["scores"] == kept["scores"] and found["folder"] == str(folder) and found["training"] == summary
    (folder / f"scores-{key}.json").write_text('{"width": 64}')
    with pytest.raises(CorruptFile, match=r"scores-.*\.json: cached scores without \['scores', 'queries', 'encode'\]"):
        trainings.scored_training(setup, BASE_MODEL, BASE_TRAIN, tasks, [16])


def test_the_run_writes_the_comparisons_files_inside_itself_and_keeps_saved_rows(tmp_path):
    from datasets import load_from_disk

    from c2llm_lib.runs import RunDir

    from training_rows import make_rows

    run = RunDir.open("study", tmp_path)
    with pytest.raises(ValueError, match="not a path inside the run directory"):
        run.save_json("../elsewhere.json", {})
    (tmp_path / "outside").mkdir()
    (run.root / "comparison").mkdir()
    (run.root / "comparison" / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(ValueError, match="not a path inside the run directory"):
        run.save_json("comparison/link/x.json", {})
    assert not list((tmp_path / "outside").iterdir())
    first = run.save_rows("comparison/rows-1", make_rows())
    marker = first / "dataset_info.json"
    before = marker.read_bytes()
    run.save_rows("comparison/rows-1", make_rows().select(range(2)))  # keyed by content: never rewritten
    assert marker.read_bytes() == before and len(load_from_disk(str(first))) == 16


def test_the_study_judges_its_differences_over_trainings(tmp_path):
    from c2llm_lib.eval.intervals import MEAN, differences, training_differences
    from c2llm_lib.study.pooling import mean_intervals, pooling_frame, study_markdown, study_pairs, study_sentences
    from c2llm_lib.study.trainings import seed_query_rows

    entries = pooling_entries(BASE_MODEL, BASE_TRAIN, ["pma", "mean"], [])
    pma, mean = entries
    base = list(np.linspace(0.2, 0.6, 40))

    def run(values):  # one seed's `scored_training` result at full width 64
        queries = {"64": per_query({"t": values})}
        return {"width": 64, "queries": queries, "scores": {"64": {"t": float(np.mean(values))}},
                "training": {"train_seconds": 5.0}, "encode": {"seconds": 1.0, "tokens_per_second": 10.0},
                "folder": f"f{values[0]:.2f}"}  # fmt: skip

    # PMA's two seeds sit 0.2 above and 0.1 below the mean pooler on every query: over queries the seed mean is
    # +0.05 everywhere (an interval of width 0), over trainings a draw of PMA's worse seed twice is as likely as 1/4
    per_seed = {
        "PMA": {0: run([v + 0.2 for v in base]), 1: run([v - 0.1 for v in base])},
        "mean": {0: run(base), 1: run(base)},
    }
    results = {e.label: over_seeds(e, per_seed[e.label]) for e in entries}
    seed_rows = seed_query_rows(per_seed, ["PMA", "mean"])
    assert seed_rows["PMA"][1]["t"]["q0"] == pytest.approx(0.1) and len(seed_rows["mean"]) == 2
    pairs = study_pairs(entries)
    over_queries = differences(query_rows(results), pairs)
    over_trainings = training_differences(seed_rows, pairs)
    assert over_queries["PMA", "mean"][MEAN].low == pytest.approx(0.05)
    i = over_trainings["PMA", "mean"][MEAN]
    assert i.value == pytest.approx(0.05) and (i.low, i.high) == pytest.approx((-0.1, 0.2)) and i.within_noise
    frame = pooling_frame(results)
    text = study_sentences(frame, None, over_queries, {}, [0, 1], over_trainings, sweep_seed=100)
    assert "PMA - mean = +5.0 (95 % interval [-10.0, +20.0] over 2 + 2 trainings and 40 queries): within noise." in text
    assert "Beyond noise over queries but within noise over trainings (another set of seeds could reverse it): " \
           "PMA - mean." in text  # fmt: skip
    assert "over 40 queries" not in text  # the sentences judge by the interval over trainings
    bars = mean_intervals(results, seed_rows=seed_rows)
    assert bars["poolers"]["PMA"].trainings == (2,) and bars["poolers"]["mean"].low < bars["poolers"]["mean"].high
    setting = {"cpu": {"model": "a CPU", "capabilities": [], "threads": 2}, "device": "cpu", "dtype": "float32",
               "backbone": "tiny", "steps": 3, "global_batch_size": 4, "num_negatives": 1, "max_length": 64,
               "seeds": [0, 1], "timed seconds": 60.0, "grid": None, "sweep seed": 100,
               "selected on validation": [{"model": "PMA", "seed": 100, "folder": "s"}],
               "scored on test": [{"model": "PMA", "seed": s, "folder": f"f{s}"} for s in (0, 1)]}  # fmt: skip
    swept = {"PMA": (SweepResult([SweepPoint({"learning_rate": 1e-3}, 0.5, {"t": 0.5}, "s")], 0), BASE_TRAIN)}
    page = study_markdown("study", frame, None, over_queries, text, setting, swept, over_trainings)
    assert page.index("over trainings and queries") < page.index("over queries (the seeds' mean as one model)")
    assert "#### The sweep (validation split, seed 100)" in page
    assert "Selected on validation: the 1 sweep trainings above (seed 100); none of them is scored on test. Every " \
           "test score comes from a training at seed(s) [0, 1]" in page  # fmt: skip


def test_notebook_06_states_the_k_that_trained():
    from c2llm_lib.study.plan import adjustments
    from c2llm_lib.train import most_negatives

    from training_rows import make_rows

    rows = make_rows()
    uneven = rows.map(lambda r, i: {"negatives": r["negatives"][: i % 3]}, with_indices=True)  # 0, 1 or 2 per row
    assert most_negatives(uneven) == 2  # the most a row holds, not the fewest (0)
    line = adjustments(BASE_TRAIN, most_negatives(uneven), [0, 1], sweep_seed=100)[2]
    assert line.startswith("a recipe asking for K hard negatives trains with min(K, 2): 2 is the most any training row")
    assert "at seed 100" in adjustments(BASE_TRAIN, 2, [0, 1], sweep_seed=100)[-1]


@pytest.mark.slow
def test_a_study_training_dies_with_the_process_that_started_it(tmp_path):
    """Notebook 06 trains in a subprocess of its kernel: a killed kernel (its runner killed) must take the training
    with it, or a resumed study deletes the folder the orphan is still writing (found by a hostile test)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from test_runner_kill import gone, processes_mentioning

    from c2llm_lib.runs import RunDir

    from training_rows import make_rows

    run = RunDir.open("study", tmp_path)
    rows_dir = run.save_rows("comparison/rows-1", make_rows())
    work = run.root / "comparison"
    script = (
        "import dataclasses, sys\n"
        "from c2llm_lib.study.trainings import train_recipe\n"
        "from c2llm_lib.config import ModelConfig, TrainConfig\n"
        "model = ModelConfig(backbone='tiny-random-qwen2', dtype='float32', max_length=32, pma_heads=4,\n"
        "                    use_lora=True)\n"
        "train = TrainConfig(max_steps=100000, epochs=100000, global_batch_size=4, warmup_steps=1, max_length=32,\n"
        "                    num_negatives=1, checkpoint_steps=[])\n"
        "train_recipe(model, train, sys.argv[1], sys.argv[2])\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script, str(rows_dir), str(work)], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.time() + 240
        while not [p for p in processes_mentioning(str(work)) if p != parent.pid]:
            assert parent.poll() is None, "the parent ended before its training started"
            assert time.time() < deadline, "no training process started"
            time.sleep(0.5)
        time.sleep(2)  # the training is under way (its process has started), not merely forked
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        assert gone(str(work), timeout=60) == []  # the orphan would go on training into the run
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
        for pid in processes_mentioning(str(work)):
            os.kill(pid, signal.SIGKILL)


def test_the_one_calls_parts_hold_what_the_notebooks_cells_built():
    """`compare_recipes`, `compare_poolings` and `Sweeps` build the records, pages and tables that notebook 06's cells
    built from the same parts, so the notebook saves the same files."""
    from c2llm_lib.eval.intervals import differences, differences_markdown, task_means, training_differences
    from c2llm_lib.study.pooling import (
        compare_poolings,
        dimension_frame,
        mean_intervals,
        overhead,
        pooling_frame,
        study_markdown,
        study_pairs,
        study_record,
        study_sentences,
        study_setting,
    )
    from c2llm_lib.study.recipes import (
        compare_recipes,
        comparison_frame,
        comparison_markdown,
        dimension_table,
        record,
        verdict,
    )
    from c2llm_lib.study.sweep import Sweeps
    from c2llm_lib.study.trainings import seed_query_rows

    def run(values, folder):
        queries = {"64": per_query({"t": values})}
        return {"width": 64, "queries": queries, "scores": {"64": {"t": float(np.mean(values))}},
                "training": {"train_seconds": 5.0, "tokens_per_second": 9.0}, "folder": folder,
                "encode": {"seconds": 1.0, "tokens_per_second": 10.0}}  # fmt: skip

    base = list(np.linspace(0.2, 0.6, 40))
    entries = pooling_entries(BASE_MODEL, BASE_TRAIN, ["pma", "mean"], [])
    per_seed = {"PMA": {0: run([v + 0.2 for v in base], "a"), 1: run([v - 0.1 for v in base], "b")},
                "mean": {0: run(base, "c"), 1: run(base, "d")}}  # fmt: skip
    results = {e.label: over_seeds(e, per_seed[e.label]) for e in entries}
    point = SweepPoint({"learning_rate": 1e-3}, 0.5, {"t": 0.5}, "s")
    split = type("Split", (), {"summary": lambda self: {"rule": "file"}})()
    sweeps = Sweeps(GRID, 100, split, {"PMA": (SweepResult([point], 0), BASE_TRAIN)})
    assert sweeps.record == {"validation": {"rule": "file"}, "grid": GRID.__dict__, "seed": 100,
                             "models": {"PMA": sweeps.chosen["PMA"][0].to_dict()}}  # fmt: skip
    study = compare_poolings(entries, results, per_seed, [0, 1], [], BASE_MODEL, BASE_TRAIN, sweeps, "run")
    poolers, widths = pooling_frame(results, sweeps.chosen), dimension_frame(results)
    diffs = differences(query_rows(results), study_pairs(entries))
    seed_rows = seed_query_rows(per_seed, list(results))
    over = training_differences(seed_rows, study_pairs(entries))
    findings = study_sentences(poolers, widths, diffs, overhead(results), [0, 1], over, 100)
    setting = study_setting(BASE_MODEL, BASE_TRAIN, [0, 1], GRID, split, [], per_seed, sweeps.chosen, 100)
    assert study.outcome == findings and study.setting == setting
    assert json.dumps(study.record, default=str) == json.dumps(
        study_record(poolers, widths, diffs, results, sweeps.chosen, setting, over), default=str)  # fmt: skip
    assert study.markdown == study_markdown("run", poolers, widths, diffs, findings, setting, sweeps.chosen, over)
    assert study.intervals == mean_intervals(results, seed_rows=seed_rows) and study.figure is not None
    assert study.table.equals(poolers) and compare_recipes(entries, results, per_seed, {}, [], "here", "run") is None

    recipes = plan(BASE_MODEL, BASE_TRAIN, ["c2llm-0.5b", "codexembed-style"], [16], [16])
    by_seed = {e.label: {0: run([0.5] * 40, e.label)} for e in recipes}
    found = {e.label: result(e, {0: {str(e.model.embedding_dim or 64): {"t": [0.5] * 40},
                                     **({} if e.projected else {"16": {"t": [0.25] * 40}})}},
                             e.model.embedding_dim or 64) for e in recipes}  # fmt: skip
    bm25 = per_query({"t": [0.4] * 40})
    made = compare_recipes(recipes, found, by_seed, bm25, ["a note"], "metrics/train.json", "run")
    table = comparison_frame(found, task_means(bm25))
    dims = dimension_table(table)
    diffs = differences(query_rows(found, bm25), recipe_pairs(recipes))
    outcome = verdict(table, dims, ["a note"], diffs)
    trainings = {label: {0: by_seed[label][0]["training"]} for label in found}
    assert made.outcome == outcome and made.table.equals(table) and made.dimensions.equals(dims)
    assert json.dumps(made.record) == json.dumps(
        record(table, dims, trainings, ["a note"], "metrics/train.json", diffs)
    )
    assert made.markdown == (
        comparison_markdown(table, "Recipes on equal terms, run run")
        + "\n"
        + differences_markdown(diffs, "Differences with 95 % intervals")
        + "\n"
        + outcome
        + "\n"
    )
    assert compare_poolings(recipes, found, by_seed, [0], [], BASE_MODEL, BASE_TRAIN, None, "run") is None
