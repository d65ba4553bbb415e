"""The paired bootstrap's known answers, and per-query scores that average to the tables' scores."""

import numpy as np
import pytest

from c2llm_lib.eval.intervals import (
    MEAN,
    Interval,
    bootstrap_mean,
    cell,
    paired_bootstrap,
    seed_mean,
    sentence,
    task_means,
)


def scores(values: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {task: {f"q{i}": float(v) for i, v in enumerate(vs)} for task, vs in values.items()}


RNG = np.random.default_rng(1)
A = scores({"t1": RNG.uniform(size=40), "t2": RNG.uniform(size=25)})


def test_identical_models_differ_by_exactly_nothing():
    for interval in paired_bootstrap(A, A).values():
        assert (interval.value, interval.low, interval.high) == (0.0, 0.0, 0.0) and interval.within_noise


def test_a_constant_offset_is_the_interval():
    shifted = {t: {q: v - 0.125 for q, v in qs.items()} for t, qs in A.items()}
    for key, interval in paired_bootstrap(A, shifted).items():
        assert interval.value == pytest.approx(0.125, abs=1e-12), key
        assert interval.low == pytest.approx(0.125, abs=1e-12) and interval.high == pytest.approx(0.125, abs=1e-12)
        assert not interval.within_noise


def test_symmetric_and_reproducible():
    b = scores({"t1": RNG.uniform(size=40), "t2": RNG.uniform(size=25)})
    ab, ba = paired_bootstrap(A, b, seed=3), paired_bootstrap(b, A, seed=3)
    for key in ab:
        assert ab[key].value == pytest.approx(-ba[key].value, abs=1e-12)
        assert ab[key].low == pytest.approx(-ba[key].high, abs=1e-12)
        assert ab[key].high == pytest.approx(-ba[key].low, abs=1e-12)
    assert paired_bootstrap(A, b, seed=3) == ab  # the same seed, the same interval
    assert paired_bootstrap(A, b, seed=4)[MEAN] != ab[MEAN]  # the seed is what is fixed


def test_a_known_true_difference_lies_inside_and_pairing_narrows_the_interval():
    rng = np.random.default_rng(7)
    difficulty = rng.uniform(0, 1, size=(2, 300))  # shared by both models: query difficulty
    noise = rng.normal(0, 0.05, size=(2, 2, 300))
    a = scores({"t1": difficulty[0] + 0.03 + noise[0, 0], "t2": difficulty[1] + 0.03 + noise[0, 1]})
    b = scores({"t1": difficulty[0] + noise[1, 0], "t2": difficulty[1] + noise[1, 1]})
    paired = paired_bootstrap(a, b)
    for key in ("t1", "t2", MEAN):
        assert paired[key].low < 0.03 < paired[key].high, key
    assert not paired[MEAN].within_noise
    assert paired[MEAN].queries == 600 and paired["t1"].queries == 300
    # unpaired, each model's own interval spans the spread of difficulty: far wider than the paired difference's
    alone = bootstrap_mean(a)[MEAN]
    assert alone.high - alone.low > 3 * (paired[MEAN].high - paired[MEAN].low)


def test_the_mean_over_tasks_weighs_tasks_equally():
    a = scores({"small": [1.0, 1.0], "large": [0.0] * 10})
    b = scores({"small": [0.0, 0.0], "large": [0.0] * 10})
    assert paired_bootstrap(a, b)[MEAN].value == pytest.approx(0.5)  # (1 + 0) / 2, not 2 / 12
    assert task_means(a) == {"small": 1.0, "large": 0.0}


def test_unpaired_input_is_refused_by_name():
    with pytest.raises(ValueError, match=r"task 't1': PMA and mean are scored on different queries \(1 differ"):
        paired_bootstrap(A, {**A, "t1": {**A["t1"], "q99": 0.5}}, names=("PMA", "mean"))
    with pytest.raises(ValueError, match=r"different tasks: \['t2'\]"):
        paired_bootstrap(A, {"t1": A["t1"]})
    with pytest.raises(ValueError, match="may not be named 'mean'"):
        paired_bootstrap({"mean": {"q": 1.0}}, {"mean": {"q": 0.0}})
    with pytest.raises(ValueError, match="resamples must be at least 1"):
        paired_bootstrap(A, A, resamples=0)
    with pytest.raises(ValueError, match="no seeds"):
        seed_mean([])


def test_seeds_enter_as_their_mean_per_query():
    one, two = scores({"t": [0.0, 1.0]}), scores({"t": [1.0, 1.0]})
    assert seed_mean([one, two]) == {"t": {"q0": 0.5, "q1": 1.0}}
    with pytest.raises(ValueError, match="seed 0 and seed 1 are scored on different queries"):
        seed_mean([one, scores({"t": [1.0, 1.0, 1.0]})])


def test_cells_and_sentences_say_within_noise_when_the_interval_holds_zero():
    assert cell(Interval(0.032, -0.01, 0.075, 40)) == "+3.2 [-1.0, +7.5]"
    text = sentence("PMA", "mean", "mean over tasks", Interval(0.032, -0.01, 0.075, 200))
    assert text == "mean over tasks: PMA - mean = +3.2 (95 % interval [-1.0, +7.5] over 200 queries): within noise."
    text = sentence("PMA", "mean", "HumanEval", Interval(-0.05, -0.08, -0.02, 40))
    assert text.endswith("mean is ahead.")
    assert Interval(0.1, 0.0, 0.2, 5).to_dict()["within_noise"]


def test_per_query_scores_average_to_mtebs_scores(make_encoder, tmp_path):
    """The bootstrap's input: per-query nDCG@10 read back from mteb's cache without encoding, and BM25's from our
    scorer, average to the scores of the results table."""
    from c2llm_lib.eval.mteb import evaluate_all, query_scores
    from c2llm_lib.eval.tasks import offline_tasks

    tasks = offline_tasks(limit=6, include_humaneval=False, max_documents=30)[:2]
    models = {"mean": make_encoder(pooling="mean"), "pma": make_encoder(pma_heads=4)}
    table = evaluate_all(models, tasks, tmp_path, batch_size=8, max_length=64, log=lambda *_: None)
    for model in models.values():
        model.encode = None  # read back, never encoded again
    per_query = query_scores(models, tasks, tmp_path, batch_size=8, max_length=64)
    assert set(per_query) == {"BM25", "mean", "pma"}
    for label, by_task in per_query.items():
        for task in tasks:
            assert list(by_task[task.name]) == list(task.queries)
            assert np.mean(list(by_task[task.name].values())) == pytest.approx(table[label][task.name], abs=1e-5)
    with pytest.raises(LookupError, match="no current per-query result of local/mean.*evaluate it first"):
        query_scores({"mean": models["mean"]}, tasks, tmp_path / "elsewhere", bm25=False, batch_size=8, max_length=64)


def offset(run: dict[str, dict[str, float]], by: float) -> dict[str, dict[str, float]]:
    return {t: {q: v + by for q, v in qs.items()} for t, qs in run.items()}


def test_the_interval_over_trainings_holds_the_spread_between_seeds_that_queries_cannot_see():
    from c2llm_lib.eval.intervals import differences, training_bootstrap

    trainings = [offset(A, c) for c in (0.1, 0.0, -0.1)]  # three seeds that differ by a constant on every query
    over_queries = differences({"A": seed_mean(trainings), "B": A}, [("A", "B")])[("A", "B")]
    over_trainings = training_bootstrap(trainings, [A])
    for key in (*A, MEAN):
        assert over_queries[key].value == pytest.approx(0.0, abs=1e-12)
        assert (over_queries[key].low, over_queries[key].high) == pytest.approx((0.0, 0.0), abs=1e-12)
        # every draw of 3 seeds from {+0.1, 0, -0.1}: all three -0.1 has probability 1/27 > 2.5 %, so the percentile
        # interval is exactly the extremes; the query part cancels (paired)
        i = over_trainings[key]
        assert i.value == pytest.approx(0.0, abs=1e-12)
        assert (i.low, i.high) == pytest.approx((-0.1, 0.1), abs=1e-12)
        assert i.within_noise and i.trainings == (3, 1)
    assert "over 3 + 1 trainings and 65 queries" in sentence("A", "B", "mean", over_trainings[MEAN])


def test_a_training_is_drawn_once_for_every_task():
    from c2llm_lib.eval.intervals import training_bootstrap

    trainings = [offset(A, c) for c in (0.1, 0.0, -0.1)]
    mean = training_bootstrap(trainings, [A])[MEAN]
    # drawn per task instead, the mean over 2 tasks would need all 6 draws at -0.1 (1/729 < 2.5 %) to reach -0.1
    assert (mean.low, mean.high) == pytest.approx((-0.1, 0.1), abs=1e-12)


def test_the_value_over_trainings_is_the_difference_of_seed_means():
    from c2llm_lib.eval.intervals import training_bootstrap, training_bootstrap_mean

    rng = np.random.default_rng(7)
    a = [scores({"t1": rng.uniform(size=40), "t2": rng.uniform(size=25)}) for _ in range(3)]
    b = [scores({"t1": rng.uniform(size=40), "t2": rng.uniform(size=25)}) for _ in range(2)]
    by_queries = paired_bootstrap(seed_mean(a), seed_mean(b))
    by_trainings = training_bootstrap(a, b)
    for key in by_queries:
        assert by_trainings[key].value == pytest.approx(by_queries[key].value, abs=1e-12)
        assert by_trainings[key].low <= by_trainings[key].value <= by_trainings[key].high
    alone = training_bootstrap_mean(a)[MEAN]
    assert alone.value == pytest.approx(np.mean([task_means(seed_mean(a))[t] for t in ("t1", "t2")]))
    assert alone.trainings == (3,)
    assert training_bootstrap(a, b) == by_trainings  # a fixed seed: reproducible


def test_trainings_scored_on_other_queries_are_named():
    from c2llm_lib.eval.intervals import training_bootstrap, training_differences

    other = {"t1": dict(list(A["t1"].items())[:-1]), "t2": A["t2"]}
    with pytest.raises(ValueError, match="PMA, training 2"):
        training_bootstrap([A, other], [A], names=("PMA", "mean"))
    with pytest.raises(ValueError, match="no trainings"):
        training_bootstrap([], [A])
    with pytest.raises(KeyError, match="no per-training scores"):
        training_differences({"A": [A]}, [("A", "B")])
