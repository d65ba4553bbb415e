"""benchmarks/unseen_seeds.py: runs of the default's recipe at several seeds compared on the unseen-library tasks."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "unseen_seeds.py"
spec = importlib.util.spec_from_file_location("unseen_seeds", PATH)
seeds = sys.modules.setdefault("unseen_seeds", importlib.util.module_from_spec(spec))
spec.loader.exec_module(seeds)

T2C, C2C = "unseen-text2code-lib", "unseen-code2code-lib"
BM25 = {T2C: {"q1": 0.5, "q2": 0.5, "q3": 0.5}, C2C: {"q1": 1.0, "q2": 1.0}}


def write_run(root: Path, trained: dict, bm25: dict = BM25) -> Path:
    (root / "metrics").mkdir(parents=True)
    scores = {"C2LLM recipe (merged), 30 steps": trained, "BM25": bm25, "untrained, mean pooling": bm25}
    (root / "metrics" / "unseen_queries.json").write_text(json.dumps(scores))
    return root


def constant(t2c: float, c2c: float = 0.0) -> dict:
    return {T2C: {q: t2c for q in BM25[T2C]}, C2C: {q: c2c for q in BM25[C2C]}}


def test_known_means_and_differences_on_the_chosen_kind(tmp_path):
    a = [write_run(tmp_path / f"a{s}", constant(0.6 + 0.1 * s)) for s in range(2)]  # 0.6, 0.7: mean 0.65
    b = [write_run(tmp_path / "b0", constant(0.9))]
    text = seeds.compare({"A": a, "B": b}, "text2code")
    assert "(1: unseen-text2code-lib; 3 queries)" in text
    assert "| A | 2 | 60.0, 70.0 | 65.0 [60.0, 70.0] |" in text  # the interval's ends are the two runs
    assert "| BM25 | | 50.0 | |" in text
    assert "| A - BM25 | +15.0 [+10.0, +20.0] | no |" in text
    assert "| B - BM25 | +40.0 [+40.0, +40.0] | no |" in text
    assert "| B - A | +25.0 [+20.0, +30.0] | no |" in text
    assert "code2code" not in text.split("\n\n", 1)[1]  # the code->code task's scores were left out


def test_a_difference_that_moves_with_the_seed_is_within_noise(tmp_path):
    a = [write_run(tmp_path / f"a{s}", constant(v)) for s, v in enumerate((0.2, 0.8))]  # around BM25's 0.5
    assert "| A - BM25 | +0.0 [-30.0, +30.0] | yes |" in seeds.compare({"A": a}, "text2code")


def test_runs_of_other_tasks_or_queries_are_refused(tmp_path):
    a = write_run(tmp_path / "a", constant(0.6))
    other = {T2C: {"q1": 0.5, "q2": 0.5, "q9": 0.5}, C2C: BM25[C2C]}
    b = write_run(tmp_path / "b", {T2C: {"q1": 1, "q2": 1, "q9": 1}, C2C: BM25[C2C]}, bm25=other)
    with pytest.raises(ValueError, match="BM25's scores differ between runs"):
        seeds.compare({"A": [a], "B": [b]}, "text2code")


def test_bad_run_directories_are_named(tmp_path, capsys):
    assert seeds.main(["--model", "A", str(tmp_path / "nothing")]) == 1
    assert "nothing/metrics/unseen_queries.json: no unseen-library scores" in capsys.readouterr().err
    run = tmp_path / "two"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics" / "unseen_queries.json").write_text(json.dumps({"m1": BM25, "m2": BM25, "BM25": BM25}))
    with pytest.raises(ValueError, match="expected one trained model and BM25"):
        seeds.read_run(run, "all")
    with pytest.raises(SystemExit):
        seeds.main(["--model", "A"])  # a label without runs


def test_the_record_is_written_where_asked(tmp_path):
    run = write_run(tmp_path / "a", constant(0.7, 0.5))
    out = tmp_path / "record.md"
    assert seeds.main(["--model", "A", str(run), "--kind", "code2code", "--out", str(out)]) == 0
    assert "| A - BM25 | -50.0 [-50.0, -50.0] | no |" in out.read_text()
    out.write_text("the user's own notes")
    assert seeds.main(["--model", "A", str(run), "--out", str(out)]) == 1  # an existing file is never overwritten
    assert out.read_text() == "the user's own notes"
    assert seeds.main(["--model", "A", str(run), "--out", str(tmp_path / "no" / "such" / "dir.md")]) == 1


def test_the_mean_is_over_tasks_not_pooled_queries(tmp_path):
    trained = {T2C: {"q1": 1.0, "q2": 0.0, "q3": 0.0}, C2C: {"q1": 1.0, "q2": 1.0}}  # tasks 1/3 and 1; pooled 3/5
    text = seeds.compare({"A": [write_run(tmp_path / "a", trained)]}, "all")
    assert "| A | 1 | 66.7 |" in text and "| BM25 | | 75.0 | |" in text
    assert "| A - BM25 | -8.3 [" in text
    assert "One run only for A: its intervals are over queries alone" in text


def test_crafted_or_repeated_runs_are_refused_by_name(tmp_path):
    bad = tmp_path / "bad"
    (bad / "metrics").mkdir(parents=True)
    (bad / "metrics" / "unseen_queries.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad/metrics/unseen_queries.json: not JSON"):
        seeds.read_run(bad, "all")
    (bad / "metrics" / "unseen_queries.json").write_text(json.dumps(["a", "list"]))
    with pytest.raises(ValueError, match="expected {model: {task"):
        seeds.read_run(bad, "all")
    fewer = write_run(tmp_path / "fewer", {T2C: BM25[T2C]})  # the trained model lacks the code->code task
    with pytest.raises(ValueError, match="were scored on different tasks"):
        seeds.read_run(fewer, "code2code")
    run = write_run(tmp_path / "a", constant(0.6))
    with pytest.raises(ValueError, match="a run is given more than once"):
        seeds.compare({"A": [run], "B": [tmp_path / "x" / ".." / "a"]}, "text2code")
