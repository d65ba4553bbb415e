"""Any mteb benchmark by name: the names resolve in the installed mteb (an unknown one is an error listing them), a
params override reaches notebook 04, and every named benchmark runs through mteb.evaluate, mock tasks standing in
for the hub, with its results cached and its table beside the public figures."""

import pytest

from c2llm_lib.config import EvalStage
from c2llm_lib.eval import benchmarks
from c2llm_lib.eval.benchmarks import (
    PUBLIC_MEANS,
    available_benchmarks,
    check_benchmarks,
    evaluate_benchmarks,
    select_tasks,
)
from c2llm_lib.eval.mteb import MTEBEncoder
from c2llm_lib.params import load_params, parse_sets, resolve

NAMED = ["MTEB(Code, v1)", "CoREB(v1)", "RTEB(Code, beta)", "CodeRAG"]


def test_the_code_benchmarks_exist_in_the_installed_mteb():
    check_benchmarks(NAMED)
    assert EvalStage().benchmarks == ["MTEB(Code, v1)"]
    assert sorted(select_tasks(["MTEB(Code, v1)"], ["all"])["MTEB(Code, v1)"]) == sorted(benchmarks.MTEB_CODE_TASKS)
    assert len(select_tasks(["CoREB(v1)"], ["all"])["CoREB(v1)"]) == 6  # three retrieval, three reranking tasks


def test_an_absent_benchmark_is_an_error_listing_the_available_ones():
    with pytest.raises(ValueError, match=r"benchmarks: 'RTEB\(Code\)' is not a benchmark .*RTEB\(Code, beta\)") as err:
        check_benchmarks(["RTEB(Code)"])  # mteb 2.26 ships it as "RTEB(Code, beta)"
    assert "Available: " in str(err.value) and all(name in str(err.value) for name in available_benchmarks())
    with pytest.raises(ValueError, match="must be quoted in YAML"):
        check_benchmarks(["MTEB(Code", "v1)"])  # what --set benchmarks=[MTEB(Code, v1)] parses to
    with pytest.raises(ValueError, match=r"mteb_tasks: \['NoSuchTask'\] are in none of the benchmarks"):
        select_tasks(["CoREB(v1)"], ["NoSuchTask"])


def test_a_params_override_reaches_notebook_04():
    params = load_params("params/c2llm-0.5b.yaml")
    given = parse_sets(['benchmarks=["MTEB(Code, v1)", "CoREB(v1)", "RTEB(Code, beta)", "CodeRAG"]'])
    resolved = resolve({**params, **given}, "params/c2llm-0.5b.yaml")
    assert resolved["04_eval_mteb_code"]["benchmarks"] == NAMED and resolved["04_eval_mteb_code"]["mteb_tasks"]


def mock_tasks(name, tasks=("all",), mirror=None):
    """Each task of the benchmark as a mock task of the same type (retrieval or reranking) under the task's name."""
    import mteb
    from mteb.mocks.mock_tasks.reranking import MockRerankingTask
    from mteb.mocks.mock_tasks.retrieval import MockRetrievalTask

    mocks = []
    for task in mteb.get_benchmark(name).tasks:
        if list(tasks) != ["all"] and task.metadata.name not in tasks:
            continue
        base = MockRerankingTask if task.metadata.type == "Reranking" else MockRetrievalTask
        metadata = base.metadata.model_copy(update={"name": task.metadata.name})
        mocks.append(type(f"Mock_{len(mocks)}", (base,), {"metadata": metadata})())
    return mocks


@pytest.mark.slow
def test_every_named_benchmark_runs_through_mteb_and_is_cached(make_encoder, monkeypatch, tmp_path):
    monkeypatch.setattr(benchmarks, "benchmark_tasks", mock_tasks)  # the mocks stand in for the hub
    encoder = make_encoder(pooling="mean")
    model = MTEBEncoder(encoder, batch_size=8, max_length=32)
    found = evaluate_benchmarks(model, NAMED, ["all"], tmp_path, label="this run")
    assert list(found) == NAMED
    for name in NAMED:
        table = found[name]["table"]
        tasks = select_tasks([name], ["all"])[name]
        assert set(tasks) <= set(table.columns) and "this run" in table.index
        assert 0 <= table.loc["this run", "mean"] <= 100
    coreb = found["CoREB(v1)"]["table"]
    assert coreb.loc["C2LLM-0.5B (public)", "mean"] == 58.08 == PUBLIC_MEANS["CoREB(v1)"]["scores"]["C2LLM-0.5B"]
    assert "C2LLM-0.5B (paper)" in found["MTEB(Code, v1)"]["table"].index  # table 2 beside ours

    def refuse(*args, **kwargs):
        raise AssertionError("a cached task was encoded again")

    model.model.encode = refuse
    again = evaluate_benchmarks(model, ["CoREB(v1)"], ["all"], tmp_path)  # read back from the results cache
    assert again["CoREB(v1)"]["table"].equals(coreb)
