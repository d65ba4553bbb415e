"""`data_source: files` (issue 24): a user's own pairs. Their negatives are kept (at most K) and topped up with mined
ones, never a correct answer, while the hub and offline sources still have every negative mined."""

import numpy as np
import pytest
from datasets import Dataset

from c2llm_lib.data.mix import Prepared, add_hard_negatives, fingerprint_of
from c2llm_lib.data.negatives import mine_negatives, own_negatives, top_up_negatives
from c2llm_lib.data.records import text_key

# one (dataset, language) group: two rows share a query (two overloads), so each positive answers the other's query
QUERIES = [
    "read a json file", "read a json file", "write a json file", "add two numbers", "read a csv file",
    "multiply two numbers",
]  # fmt: skip
POSITIVES = [
    "def read(path):\n    return json.load(open(path))",
    "def read(path, encoding):\n    return json.loads(open(path, encoding=encoding).read())",
    "def write(path, obj):\n    json.dump(obj, open(path, 'w'))",
    "def add(a, b):\n    return a + b",
    "def read_csv(path):\n    return list(csv.reader(open(path)))",
    "def multiply(a, b):\n    return a * b",
]
SUBTRACT = "def subtract(a, b):\n    return a - b"  # a negative of the user's, not a positive of the group
GIVEN = [
    [POSITIVES[1], POSITIVES[2]],  # the sibling's positive is a correct answer: dropped
    [],
    [POSITIVES[2], " def write(path, obj):\n    json.dump(obj,  open(path, 'w'))"],  # its own positive, twice
    [SUBTRACT, POSITIVES[5], POSITIVES[4]],  # more than K = 2: the first 2
    [POSITIVES[2]],
    [],
]


def test_own_negatives_known_answer():
    own = own_negatives(["q", "q", "r"], ["A", "B", "C"], [["B", "X", " X", "Y", "Z"], [], ["A"]], k=2)
    assert own.kept == [["X", "Y"], [], ["A"]]  # B answers q (row 1); " X" repeats X; cut at k; A does not answer r
    assert (own.answers, own.cut) == (1, 1)
    with pytest.raises(ValueError, match="3 queries, 3 positives, 2 lists of negatives"):
        own_negatives(["q", "q", "r"], ["A", "B", "C"], [[], []], k=2)


def _is_correct_answer(query: str, negative: str) -> bool:
    return any(text_key(q) == text_key(query) and text_key(p) == text_key(negative)
               for q, p in zip(QUERIES, POSITIVES, strict=True))  # fmt: skip


def test_top_up_keeps_own_negatives_first_and_mines_the_rest_never_a_correct_answer():
    own = own_negatives(QUERIES, POSITIVES, GIVEN, k=2)
    topped = top_up_negatives(QUERIES, POSITIVES, own.kept, k=2)
    assert [row[: len(kept)] for row, kept in zip(topped, own.kept, strict=True)] == own.kept  # own ones first
    assert topped[0][0] == POSITIVES[2] and topped[3] == [SUBTRACT, POSITIVES[5]] and topped[4][0] == POSITIVES[2]
    assert all(len(row) == len({text_key(n) for n in row}) == 2 for row in topped)
    for query, row in zip(QUERIES, topped, strict=True):
        assert not any(_is_correct_answer(query, n) for n in row), (query, row)
    assert own.answers == 3 and own.cut == 1
    assert top_up_negatives(QUERIES[:1], POSITIVES[:1], [["x", "y"]], k=2) == [["x", "y"]]  # full rows: no mining


def test_top_up_with_an_encoder_teacher():
    def encode(texts, kind):  # a bag of letters: a deterministic stand-in for an encoder
        vectors = np.array([[t.lower().count(c) for c in "abcdefghijklmnopqrstuvwxyz"] for t in texts], float)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    own = own_negatives(QUERIES, POSITIVES, GIVEN, k=2)
    topped = top_up_negatives(QUERIES, POSITIVES, own.kept, k=2, method="encoder", encode=encode)
    assert all(len(row) == 2 for row in topped) and topped[3] == [SUBTRACT, POSITIVES[5]]
    for query, row in zip(QUERIES, topped, strict=True):
        assert not any(_is_correct_answer(query, n) for n in row)


def _prepared(given) -> Prepared:
    rows = [
        {"dataset": "mine", "language": "python", "query": q, "positive": p, "negatives": n, "instruction": "i"}
        for q, p, n in zip(QUERIES, POSITIVES, given, strict=True)
    ]
    return Prepared(Dataset.from_list(rows), "fp-own-negatives")


def test_add_hard_negatives_keeps_given_negatives_only_when_asked():
    prepared = _prepared(GIVEN)
    mined, short = add_hard_negatives(prepared, k=2, keep_given=False)
    assert mined.rows["negatives"] == mine_negatives(QUERIES, POSITIVES, 2)  # every negative mined, as before
    assert mined.fingerprint == fingerprint_of("fp-own-negatives", "negatives", 2, "bm25", 50_000)  # as before
    assert mined.report.notes == [] and short == {}

    kept, short = add_hard_negatives(prepared, k=2, keep_given=True)
    own = own_negatives(QUERIES, POSITIVES, GIVEN, k=2).kept
    assert kept.rows["negatives"] == top_up_negatives(QUERIES, POSITIVES, own, k=2)
    assert kept.rows["negatives"][3] == [SUBTRACT, POSITIVES[5]] and short == {}
    assert kept.fingerprint != mined.fingerprint
    assert kept.report.notes == [
        "own negatives: 3 dropped as a correct answer to their query (the positive of a row with the same query); "
        "1 rows brought more than K = 2 and keep their first 2; rows with fewer than 2 are topped up by bm25"
    ]
    assert prepared.report.notes == []  # the input's report is not changed
    for row in kept.rows:
        assert not any(_is_correct_answer(row["query"], n) for n in row["negatives"])
