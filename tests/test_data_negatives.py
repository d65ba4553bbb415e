"""Hard-negative mining: BM25 on a hand-made corpus; no correct answer (the positive of any row with the same
query, or a near-duplicate of one) is ever chosen."""

import numpy as np

from c2llm_lib.data.negatives import bm25_ranker, mine_negatives, select_negatives

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
    top = bm25_ranker(["read a file", "def add(a, b): return a + b", "print x"])(["add numbers a b"], k=3)
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
    queries = ["q0", "q1", "q2", "q3"]
    picked = select_negatives(candidates, queries, positives, k=2, near_duplicate=0.7)
    assert picked == [[2, 3], [2, 3]]  # rows 0 and 1 are near-duplicates (Jaccard 0.75)
    assert select_negatives(candidates, queries, positives, k=2, near_duplicate=0.9)[0] == [1, 2]


def test_rows_sharing_a_query_never_get_each_others_positive():
    # two overloads under one docstring: each positive is a correct answer to the other row's query
    queries = ["read a json file", "read a json file", "add two numbers", "write a json file"]
    positives = [
        "def read(path): return json.load(open(path))",
        "def read(path, encoding): return json.loads(open(path, encoding=encoding).read())",
        "def add(a, b): return a + b",
        "def write(path, obj): json.dump(obj, open(path, 'w'))",
    ]
    negatives = mine_negatives(queries, positives, k=1)
    assert positives[1] not in negatives[0] and positives[0] not in negatives[1]
    assert negatives[0] == negatives[1] == [positives[3]]  # the next hardest candidate, not a correct answer
    # and a near-duplicate of a sibling's positive is a correct answer too (Jaccard 0.75 with row 1's)
    candidates = np.array([[2, 3], [2, 3], [0, 1], [0, 1]])
    near = ["zeta eta", "alpha beta gamma", "alpha beta gamma delta", "theta"]
    assert select_negatives(candidates, ["q", "q", "r", "s"], near, k=1, near_duplicate=0.7)[:2] == [[3], [3]]


def test_whitespace_variants_of_a_query_share_their_answers():
    candidates = np.array([[1, 2], [0, 2], [0, 1]])
    picked = select_negatives(candidates, ["find max", "find   max\n", "other"], ["a b", "c d", "e f"], k=1)
    assert picked == [[2], [2], [0]]


def test_small_groups_and_bad_arguments():
    assert mine_negatives(["q"], ["only one"], k=7) == [[]]
    assert mine_negatives([], [], k=7) == []
    import pytest

    with pytest.raises(ValueError, match="2 queries but 1 positives"):
        mine_negatives(["a", "b"], ["x"], k=1)
    with pytest.raises(ValueError, match="1 queries but 2 positives"):
        select_negatives(np.array([[0, 1]]), ["a"], ["x", "y"], k=1)
    with pytest.raises(ValueError, match="needs `encode`"):
        mine_negatives(["a", "b"], ["x", "y"], k=1, method="encoder")


def test_encoder_teacher(make_encoder):
    enc = make_encoder(pooling="mean")
    negatives = mine_negatives(QUERIES, DOCS, k=2, method="encoder", encode=enc.encode)
    assert all(DOCS[i] not in n and len(n) == 2 for i, n in enumerate(negatives))


def test_a_cluster_of_rows_sharing_one_query_still_gets_k_negatives():
    """The issue's case: 40 rows with the query "Fix typo" among 60 others. Every positive of the 40 is a correct
    answer to each of them and BM25 ranks those first, so a fixed depth of K * 4 + 1 = 29 left all 40 rows with no
    negative at K = 7; mining deeper finds 7 for each, none of them a correct answer."""
    queries = ["Fix typo"] * 40 + [f"add feature {i} to module {i % 7}" for i in range(60)]
    positives = [f"- fix typo in docs line {i}\n+ fixed typo in docs line {i}" for i in range(40)] + [
        f"+ def feature_{i}(x):\n+     return module_{i % 7}.call(x, {i})" for i in range(60)
    ]
    negatives = mine_negatives(queries, positives, k=7)
    cluster = set(positives[:40])
    assert all(len(negatives[i]) == 7 and not cluster & set(negatives[i]) for i in range(40))
    assert all(len(n) == 7 for n in negatives[40:])


def test_a_group_too_small_gives_fewer_negatives_and_stops():
    # 3 rows: at most 2 candidates are not the row's own answer, whatever the depth
    negatives = mine_negatives(["alpha beta", "gamma delta", "epsilon zeta"],
                               ["alpha beta one", "gamma delta two", "epsilon zeta three"], k=7)  # fmt: skip
    assert [len(n) for n in negatives] == [2, 2, 2]
