"""A local retrieval set in the BEIR layout (notebook 04's `beir_sets`): known answers, mteb, and every bad input
named by file, line and column."""

import json
from pathlib import Path

import pytest

from c2llm_lib.data.beir import read_beir, read_beir_sets
from c2llm_lib.data.records import DataError

CORPUS = [
    {"_id": "d1", "title": "json", "text": "def load(path):\n    return json.load(open(path))"},
    {"_id": "d2", "title": "", "text": "def save(path, obj):\n    json.dump(obj, open(path, 'w'))"},
    {"_id": 3, "text": "  def add(a, b):\n    return a + b  "},  # an integer id, no title
    {"_id": "d4", "title": None, "text": "def sub(a, b):\n    return a - b"},
]
QUERIES = [
    {"_id": "q1", "text": "read a json file"},
    {"_id": "q2", "text": "write a json file", "metadata": {"split": "test"}},  # extra keys are ignored
    {"_id": "q3", "text": "a training query that no test judgement names"},
    {"_id": "q4", "text": "add two numbers"},
    {"_id": "q5", "text": "judged, but nothing is relevant to it"},
]
QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t2\nq2\td1\t1\nq4\t3\t1\nq5\td4\t0\n"


def write_set(folder: Path, corpus=CORPUS, queries=QUERIES, qrels=QRELS) -> Path:
    (folder / "qrels").mkdir(parents=True)
    for name, rows in (("corpus.jsonl", corpus), ("queries.jsonl", queries)):
        text = rows if isinstance(rows, (str, bytes)) else "".join(json.dumps(r) + "\n" for r in rows)
        (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    (folder / "qrels" / "test.tsv").write_bytes(qrels if isinstance(qrels, bytes) else qrels.encode())
    return folder


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def test_a_beir_set_reads_as_one_task_known_answer(tmp_path):
    folder = write_set(tmp_path / "my-set")
    before = snapshot(folder)
    task = read_beir(folder, "Find the code:")
    assert task.name == "beir-my-set" and task.instruction == "Find the code:"
    assert task.queries == {"q1": "read a json file", "q2": "write a json file", "q4": "add two numbers"}
    assert task.qrels == {"q1": {"d1": 1}, "q2": {"d2": 2, "d1": 1}, "q4": {"3": 1}}  # graded, ids as texts
    assert task.corpus == {
        "d1": "json def load(path):\n    return json.load(open(path))",  # title and text, as mteb joins them
        "d2": "def save(path, obj):\n    json.dump(obj, open(path, 'w'))",
        "3": "def add(a, b):\n    return a + b",  # stripped
        "d4": "def sub(a, b):\n    return a - b",  # a null title is no title
    }
    assert snapshot(folder) == before and sorted(p.name for p in folder.rglob("*")) == sorted(
        ["corpus.jsonl", "queries.jsonl", "qrels", "test.tsv"]
    )  # nothing written beside the set


def test_a_beir_set_is_scored_through_mteb_with_its_instruction(tmp_path, make_encoder):
    from c2llm_lib.eval.mteb import evaluate_all
    from c2llm_lib.eval.tasks import instruction_overrides, limit_task, task_prompts, task_sizes

    task = read_beir(write_set(tmp_path / "set"), "Find the code:")
    encoder = make_encoder(pooling="mean")
    assert instruction_overrides(encoder.config, [task]) == {"beir-set": "Find the code:"}
    assert task_prompts(encoder.config, task.name, instruction_overrides(encoder.config, [task]))[0] == "Find the code:"
    assert instruction_overrides(make_encoder(pooling="mean", prompt_style="jina").config, [task]) == {}
    scores = evaluate_all({"mean": encoder}, [task], tmp_path / "mteb", log=lambda *_: None)
    assert set(scores) == {"BM25", "mean"} and all(0 <= s["beir-set"] <= 1 for s in scores.values())
    assert scores["BM25"]["beir-set"] > 0.6  # lexical overlap finds the json functions
    assert task_sizes([task]) == {"beir-set": {"queries": 3, "documents": 4}}
    capped = limit_task(task, limit=1)
    assert len(capped.queries) == 1 and capped.queries.items() <= task.queries.items() and capped.corpus == task.corpus


def test_two_sets_of_one_folder_name_are_refused(tmp_path):
    write_set(tmp_path / "a" / "same")
    write_set(tmp_path / "b" / "same")
    with pytest.raises(DataError, match="both named 'beir-same'"):
        read_beir_sets([str(tmp_path / "a" / "same"), str(tmp_path / "b" / "same")], "")


def _lines(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


BAD = {  # name: (what to write over the good set, the message's file, line and column)
    "missing corpus file": ({"corpus": None}, r"corpus\.jsonl: no such file"),
    "missing queries file": ({"queries": None}, r"queries\.jsonl: no such file"),
    "missing qrels file": ({"qrels": None}, r"qrels/test\.tsv: no such file"),
    "missing corpus column": (
        {"corpus": _lines([{"_id": "d1", "body": "x"}])},
        r"corpus\.jsonl, line 1: no column 'text'",
    ),
    "missing query id": ({"queries": _lines([{"id": "q1", "text": "x"}])}, r"queries\.jsonl, line 1: no column '_id'"),
    "non-text field": (
        {"queries": _lines([{"_id": "q1", "text": ["a list"]}])},
        r"queries\.jsonl, line 1, column 'text': expected a text, got list",
    ),
    "empty text": (
        {"corpus": _lines([*CORPUS[:2], {"_id": "d9", "text": "   "}])},
        r"corpus\.jsonl, line 3, column 'text': empty",
    ),
    "repeated id": (
        {"corpus": _lines([*CORPUS, {"_id": "d1", "text": "again"}])},
        r"corpus\.jsonl, line 5, column '_id': 'd1' is also on line 1",
    ),
    "not json": ({"queries": '{"_id": "q1", "text": "x"}\n{"_id": "q2",\n'}, r"queries\.jsonl, line 2: not JSON"),
    "not an object": ({"queries": '["q1", "x"]\n'}, r"queries\.jsonl, line 1: expected a JSON object, got list"),
    "not utf-8": (
        {"corpus": _lines(CORPUS[:1]).encode() + b'{"_id": "d2", "text": "caf\xe9"}\n'},
        r"corpus\.jsonl, line 2: not UTF-8",
    ),
    "empty corpus": ({"corpus": "\n"}, r"corpus\.jsonl: the corpus is empty"),
    "unknown query": ({"qrels": QRELS + "q9\td1\t1\n"}, r"test\.tsv, line 7, column 'query-id': 'q9' is not an id of"),
    "unknown document": (
        {"qrels": QRELS + "q1\td9\t1\n"},
        r"test\.tsv, line 7, column 'corpus-id': 'd9' is not an id of corpus\.jsonl",
    ),
    "non-numeric score": ({"qrels": QRELS + "q4\td1\tyes\n"}, r"test\.tsv, line 7, column 'score': 'yes' is not an"),
    "fractional score": ({"qrels": QRELS + "q4\td1\t0.5\n"}, r"test\.tsv, line 7, column 'score': '0.5' is not an"),
    "infinite score": ({"qrels": QRELS + "q4\td1\tinf\n"}, r"test\.tsv, line 7, column 'score': 'inf' is not an"),
    "no header": ({"qrels": "q1\td1\t1\n"}, r"test\.tsv, line 1: the header must be the tab-separated columns"),
    "wrong cells": ({"qrels": QRELS + "q4 d1 1\n"}, r"test\.tsv, line 7: expected 3 tab-separated cells"),
    "repeated judgement": ({"qrels": QRELS + "q1\td1\t0\n"}, r"test\.tsv, line 7: the judgement of query 'q1'"),
    "header only": ({"qrels": "query-id\tcorpus-id\tscore\n"}, r"test\.tsv: no judgement after its header"),
    "empty qrels": ({"qrels": ""}, r"test\.tsv: empty"),
    "nothing relevant": ({"qrels": "query-id\tcorpus-id\tscore\nq1\td1\t0\n"}, r"test\.tsv: no query has a relevant"),
}


@pytest.mark.parametrize("case", BAD, ids=str)
def test_bad_beir_input_is_an_error_naming_file_line_and_column(tmp_path, case):
    changes, message = BAD[case]
    folder = write_set(tmp_path / "set")
    paths = {"corpus": folder / "corpus.jsonl", "queries": folder / "queries.jsonl"}
    paths["qrels"] = folder / "qrels" / "test.tsv"
    for key, content in changes.items():
        if content is None:
            paths[key].unlink()
        else:
            paths[key].write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataError, match=message):
        read_beir(folder, "")


def test_a_missing_folder_or_a_file_is_named(tmp_path):
    with pytest.raises(DataError, match=r"BEIR set '.*nowhere' .*: no such folder"):
        read_beir(tmp_path / "nowhere", "")
    (tmp_path / "file.jsonl").write_text("{}")
    with pytest.raises(DataError, match="not a folder"):
        read_beir(tmp_path / "file.jsonl", "")


def test_the_beir_keys_of_notebook_04_are_validated_by_name():
    from c2llm_lib.checks import ConfigError
    from c2llm_lib.config import EvalStage

    assert EvalStage(beir_sets=["a", "b"]).beir_instruction.startswith("Given a query")
    with pytest.raises(ConfigError, match="'beir_sets' must be folder paths"):
        EvalStage(beir_sets=[" "])
    with pytest.raises(ConfigError, match="'beir_sets' repeats a folder"):
        EvalStage(beir_sets=["a", "a"])
    with pytest.raises(ConfigError, match="beir_sets"):
        EvalStage(beir_sets="a")  # a list of folders, not one
