"""Hard-negative mining: BM25 on a hand-made corpus, the positive and near-duplicates never chosen."""

import numpy as np

from c2llm_lib.data.negatives import bm25_scores_topk, mine_negatives, select_negatives

DOCS = [
    "def read_json(path): return json.load(open(path))",
    "def write_json(path, obj): json.dump(obj, open(path, 'w'))",
    "def add(a, b): return a + b",
    "def read_csv(path): return list(csv.reader(open(path)))",
    "def read_json(path):   return json.load(open(path))",  # a formatting-only duplicate of 0
    "def multiply(a, b): return a * b",
]
QUERIES = [
    "read json file path",
    "write json object to path",
    "add two numbers",
    "read csv file path",
    "load json from path",
    "multiply two numbers",
]


def test_bm25_ranks_the_matching_document_first():
    top = bm25_scores_topk(["add numbers a b"], ["read a file", "def add(a, b): return a + b", "print x"], k=3)
    assert top.shape == (1, 3) and top[0, 0] == 1


def test_negatives_exclude_the_positive_and_near_duplicates():
    negatives = mine_negatives(QUERIES, DOCS, k=3)
    for i, negs in enumerate(negatives):
        assert DOCS[i] not in negs
        assert len(negs) == len(set(negs)) <= 3
    assert DOCS[4] not in negatives[0] and DOCS[0] not in negatives[4]  # near-duplicates of each other
    assert DOCS[1] in negatives[0]  # the hard one: another json function


def test_select_negatives_known_answer():
    candidates = np.array([[0, 1, 2, 3], [1, 0, 2, 3]])
    positives = ["alpha beta gamma", "alpha beta gamma delta", "zeta", "eta"]
    picked = select_negatives(candidates, positives, k=2, near_duplicate=0.7)
    assert picked == [[2, 3], [2, 3]]  # rows 0 and 1 are near-duplicates (Jaccard 0.75)
    assert select_negatives(candidates, positives, k=2, near_duplicate=0.9)[0] == [1, 2]


def test_small_groups_and_bad_arguments():
    assert mine_negatives(["q"], ["only one"], k=7) == [[]]
    assert mine_negatives([], [], k=7) == []
    import pytest

    with pytest.raises(ValueError, match="2 queries but 1 positives"):
        mine_negatives(["a", "b"], ["x"], k=1)
    with pytest.raises(ValueError, match="needs `encode`"):
        mine_negatives(["a", "b"], ["x", "y"], k=1, method="encoder")


def test_encoder_teacher(make_encoder):
    enc = make_encoder(pooling="mean")
    negatives = mine_negatives(QUERIES, DOCS, k=2, method="encoder", encode=enc.encode)
    assert all(DOCS[i] not in n and len(n) == 2 for i, n in enumerate(negatives))
