"""Decontamination by rule (section 4.1): a training row goes when its query is a test query, its positive a
document a test qrel marks relevant, or either an offline evaluation text; a test corpus document that no test
query retrieves (mteb's CoIR corpora hold the training documents too) keeps its row."""

import pytest
from datasets import Dataset
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.task_metadata import TaskMetadata
from mteb.mocks.mock_tasks.retrieval import MockRetrievalTask, general_args

from c2llm_lib.checks import ConfigError
from c2llm_lib.config import DataStage
from c2llm_lib.data import DataError, prepare_rows
from c2llm_lib.data.build import build_training_data
from c2llm_lib.data.code_trees import mine
from c2llm_lib.data.decontamination import (
    BEIR_TEXT,
    OFFLINE_EVAL_TEXT,
    POSITIVE_IS_RELEVANT,
    POSITIVE_IS_TEST_QUERY,
    QUERY_IS_RELEVANT,
    QUERY_IS_TEST_QUERY,
    RULES,
    EvalKeys,
    mteb_test_keys,
)
from c2llm_lib.data.mix import prepare_sources
from c2llm_lib.data.offline import load_snapshot
from c2llm_lib.data.records import text_key
from c2llm_lib.export import _data_section

from source_fixtures import write_fixtures


class CoirLikeTask(AbsTaskRetrieval):
    """An in-memory retrieval task in mteb 2.x's format: dataset[subset][split] = queries, corpus, relevant_docs."""

    metadata = TaskMetadata(type="Retrieval", name="CoirLikeTask", main_score="ndcg_at_10", **general_args)

    def __init__(self, queries: dict[str, str], corpus: dict[str, tuple[str, str]], qrels: dict[str, dict[str, int]]):
        super().__init__()
        self.split_data = {
            "queries": Dataset.from_list([{"id": i, "text": t} for i, t in queries.items()]),
            "corpus": Dataset.from_list([{"id": i, "title": title, "text": t} for i, (title, t) in corpus.items()]),
            "relevant_docs": qrels,
            "top_ranked": None,
        }

    def load_data(self, num_proc=None, **kwargs) -> None:
        self.dataset = {"default": {"test": self.split_data}}
        self.data_loaded = True


class CodeEditLikeTask(AbsTaskRetrieval):
    """Loaded the way mteb's CodeEditSearchRetrieval is: v1 attributes per language, evaluated on the train split."""

    metadata = TaskMetadata(
        type="Retrieval",
        name="CodeEditLikeTask",
        main_score="ndcg_at_10",
        **(general_args | {"eval_splits": ["train"], "eval_langs": {"python": ["python-Code"], "go": ["go-Code"]}}),
    )

    def load_data(self, num_proc=None, **kwargs) -> None:
        rows = {"python": [("fix typo", "- teh\n+ the")], "go": [("add a test", "+ func TestX(t *testing.T) {}")]}
        self.queries = {lang: {"train": {str(i): q for i, (q, _) in enumerate(r)}} for lang, r in rows.items()}
        self.corpus = {
            lang: {"train": {f"c{i}": {"text": d} for i, (_, d) in enumerate(r)}} for lang, r in rows.items()
        }
        self.relevant_docs = {
            lang: {"train": {str(i): {f"c{i}": 1} for i in range(len(r))}} for lang, r in rows.items()
        }
        self.data_loaded = True


# Training pairs of one CoIR-like source; the task's test corpus holds every one of their positives.
TRAIN = [(f"training question {i}", f"def train_solution_{i}(x):\n    return x + {i}") for i in range(8)]
TRAIN[3] = ("training question 3", "Header 3 def body_3(): pass")  # a positive equal to title + text of a test doc
TRAIN[4] = ("a test question", "def train_solution_4(x):\n    return x + 4")  # the query is a test query
OFFLINE = ["training question 5"]  # an offline evaluation text
CORPUS = {f"d{i}": ("", p) for i, (_, p) in enumerate(TRAIN)} | {"d3": ("Header 3", "def body_3(): pass")}
QRELS = {
    "t0": {"d1": 1, "d2": 0},  # row 1's positive is relevant; row 2's is in the corpus with score 0 only
    "t1": {"d3": 2},  # row 3's positive is this document as the model sees it (title + " " + text)
}
TEST_QUERIES = {"t0": "a test question", "t1": "another   test question"}


def training_rows(pairs):
    def rows(checker):
        for i, (q, p) in enumerate(pairs):
            row = checker.record("CoirLike", str(i), q, p, "python", "instr")
            if row is not None:
                yield row

    return rows


def test_only_test_queries_relevant_documents_and_offline_texts_are_dropped():
    task = CoirLikeTask(TEST_QUERIES, CORPUS, QRELS)
    prepared = prepare_rows(training_rows(TRAIN), "fp-coir-like", OFFLINE, mteb_keys=mteb_test_keys([task]))
    kept = sorted(prepared.rows["query"])
    assert kept == ["training question 0", "training question 2", "training question 6", "training question 7"]
    assert prepared.decontamination() == {
        "CoirLike": {
            QUERY_IS_TEST_QUERY: 1,
            POSITIVE_IS_RELEVANT: 2,
            QUERY_IS_RELEVANT: 0,
            POSITIVE_IS_TEST_QUERY: 0,
            OFFLINE_EVAL_TEXT: 1,
        }
    }
    assert prepared.summary()["decontaminated"] == prepared.decontamination()


def test_kept_counts_the_rows_that_train_not_the_rows_that_passed_the_checks():
    task = CoirLikeTask(TEST_QUERIES, CORPUS, QRELS)
    prepared = prepare_rows(training_rows(TRAIN), "fp-coir-like", OFFLINE, mteb_keys=mteb_test_keys([task]))
    counts = prepared.summary()["sources"]["CoirLike"]
    assert len(prepared.rows) == 4 and counts["kept"] == 4  # was 8: counted when checked, before decontamination
    assert counts["passed_checks"] == 8 == counts["kept"] + sum(prepared.decontamination()["CoirLike"].values())
    assert prepared.lines()[0] == (
        "CoirLike: kept 4 of 8 that passed the checks; decontamination removed 4 (1 query is a test query, "
        "2 positive is a relevant test document, 1 offline evaluation text)"
    )
    card = _data_section(prepared.summary())
    assert "| source | passed the checks | rows kept (trained on) |" in card and "| CoirLike | 8 | 4 |" in card
    assert "| CoirLike | 8 | not recorded |" in _data_section({"sources": {"CoirLike": {"kept": 8}}})  # an old record


def test_when_decontamination_removes_every_row_the_error_says_so_per_source_and_rule():
    pairs = [("a test question", f"def f{i}(): pass") for i in range(3)] + [("q", "another test question")]
    with pytest.raises(DataError) as caught:
        prepare_rows(
            training_rows(pairs),
            "fp-all-dropped",
            mteb_keys=mteb_test_keys([CoirLikeTask(TEST_QUERIES, CORPUS, QRELS)]),
        )
    message = str(caught.value)
    assert message.startswith("no training rows are left after checks and decontamination:")
    # was: "CoirLike: kept 4", the rows that passed the checks, and nothing about why none trains
    assert (
        "CoirLike: kept 0 of 4 that passed the checks; decontamination removed 4 (3 query is a test query, "
        "1 positive is a test query)" in message
    )


def test_keys_of_an_mteb_split_only_relevant_documents_as_seen_and_bare():
    queries, documents = mteb_test_keys([CoirLikeTask(TEST_QUERIES, CORPUS, QRELS)])
    assert queries == {text_key("a test question"), text_key("another test question")}
    assert documents == {text_key(TRAIN[1][1]), text_key("Header 3 def body_3(): pass"), text_key("def body_3(): pass")}


def test_mteb_mock_task():
    queries, documents = mteb_test_keys([MockRetrievalTask()])
    assert text_key("This is a test sentence") in queries and text_key("This is a positive sentence") in documents
    pairs = [
        ("a query", "This is a positive sentence"),  # bare text of a relevant document
        ("This is a test sentence", "clean code"),  # a test query
        ("another query", "Title of d1 This is a positive sentence"),  # title + text, as the model sees it
        ("yet another query", "clean code 2"),
    ]
    prepared = prepare_rows(training_rows(pairs), "fp-mteb-mock", mteb_keys=(queries, documents))
    assert prepared.rows["positive"] == ["clean code 2"]
    assert prepared.decontamination()["CoirLike"] == {
        QUERY_IS_TEST_QUERY: 1,
        POSITIVE_IS_RELEVANT: 2,
        QUERY_IS_RELEVANT: 0,
        POSITIVE_IS_TEST_QUERY: 0,
        OFFLINE_EVAL_TEXT: 0,
    }


def test_a_task_loaded_like_code_edit_search_on_its_train_split():
    queries, documents = mteb_test_keys([CodeEditLikeTask()])
    assert queries == {text_key("fix typo"), text_key("add a test")}
    assert documents == {text_key("- teh\n+ the"), text_key("+ func TestX(t *testing.T) {}")}
    pairs = [("fix typo", "- recieve\n+ receive"), ("bump version", "- 1.0\n+ 1.1")]  # the same message recurs
    prepared = prepare_rows(training_rows(pairs), "fp-code-edit", mteb_keys=(queries, documents))
    assert prepared.rows["query"] == ["bump version"]


def test_the_fingerprint_hashes_the_keys_not_their_number(tmp_path):
    a = prepare_rows(training_rows(TRAIN), "fp-same", ["training question 5"], cache_dir=tmp_path)
    b = prepare_rows(training_rows(TRAIN), "fp-same", ["training question 6"], cache_dir=tmp_path)
    assert a.fingerprint != b.fingerprint and "training question 6" not in b.rows["query"]
    assert "training question 6" in a.rows["query"]
    keys = (frozenset({text_key("x")}), frozenset())
    assert EvalKeys.of(mteb_keys=keys).fingerprint() != EvalKeys.of(["x"]).fingerprint()  # same key, other rule
    again = prepare_rows(training_rows(TRAIN), "fp-same", ["training question 5"], cache_dir=tmp_path)
    assert again.summary() == a.summary() and again.decontamination()["CoirLike"][OFFLINE_EVAL_TEXT] == 1


def test_unreadable_tasks_are_named():
    class Empty(CoirLikeTask):
        def load_data(self, num_proc=None, **kwargs):
            self.dataset = {}

    with pytest.raises(DataError, match="MTEB task CoirLikeTask: load_data left no `dataset`"):
        mteb_test_keys([Empty({}, {}, {})])

    class Broken(CoirLikeTask):
        def load_data(self, num_proc=None, **kwargs):
            raise OSError("no such dataset on disk")

    with pytest.raises(DataError, match="MTEB task CoirLikeTask: could not load its test data .no such dataset"):
        mteb_test_keys([Broken({}, {}, {})])
    bad = CoirLikeTask({"t0": "ok"}, CORPUS, {"t0": {"d1": 1}})
    bad.split_data["queries"] = Dataset.from_list([{"id": "t9", "text": ["a", "turn"]}])
    with pytest.raises(DataError, match="CoirLikeTask, subset default, split test query t9: expected a text"):
        mteb_test_keys([bad])


# End to end through notebook 01's stage: hub sources from a local folder, one CoIR-like evaluation task whose
# test corpus holds every training positive but whose qrels mark two of them relevant.
NAMES = ["AppsRetrieval", "CosQA", "SyntheticText2SQL", "CodeSearchNetCCRetrieval"]


@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory):
    return write_fixtures(tmp_path_factory.mktemp("hub"))


def test_build_keeps_the_training_set_against_a_coir_like_corpus(fixture_root):
    stage = DataStage(data_source="hub", hub_sources=NAMES, num_negatives=1, decontaminate_mteb=True)
    plain, _ = build_training_data(DataStage(data_source="hub", hub_sources=NAMES, num_negatives=1), fixture_root)
    positives = sorted(set(plain.rows["positive"]))
    corpus = {f"d{i}": ("", p) for i, p in enumerate(positives)}
    greet = positives.index("def greet(name):\n    return 'hi ' + name")
    count = positives.index("SELECT COUNT(*) FROM orders;")
    corpus[f"d{count}"] = ("orders", "SELECT COUNT(*) FROM orders;")  # titled: matched as the model sees it, and bare
    qrels = {"t0": {f"d{greet}": 1, "d0": 0}, "t1": {f"d{count}": 1}}
    task = CoirLikeTask({"t0": "greet a person", "t1": "how many orders are there"}, corpus, qrels)
    prepared, short = build_training_data(stage, local_root=fixture_root, mteb_tasks=[task])
    assert len(plain.rows) == 18 and len(prepared.rows) == 14  # was: every row dropped, "no training rows are left"
    dropped = {s: by_rule[POSITIVE_IS_RELEVANT] for s, by_rule in prepared.decontamination().items()}
    assert dropped == {"AppsRetrieval": 1, "CodeSearchNetCCRetrieval": 1, "CosQA": 1, "SyntheticText2SQL": 1}
    assert sum(n for by_rule in prepared.decontamination().values() for n in by_rule.values()) == 4
    assert prepared.fingerprint != plain.fingerprint
    lone = ("AppsRetrieval/python", "CodeSearchNetCCRetrieval/python", "CosQA/python", "SyntheticText2SQL/sql")
    assert short == dict.fromkeys(lone, 1)  # each group that lost a row has one row left: no negative to mine


def test_a_test_pair_read_backwards_is_dropped_too():
    """CodeSearchNet trains code -> docstring and docstring -> code: a test pair (code X, docstring Y) must not
    train as (Y, X) either, nor may a test query be trained as an answer."""
    keys = EvalKeys.of(mteb_keys=({text_key("def x(): pass")}, {text_key("Y: the docstring")}))
    assert keys.rule("def x():  pass", "Y: the docstring") == QUERY_IS_TEST_QUERY
    assert keys.rule("Y: the  docstring", "def x(): pass") == QUERY_IS_RELEVANT  # was None: it trained
    assert keys.rule("another docstring", "def x(): pass") == POSITIVE_IS_TEST_QUERY  # was None
    assert keys.rule("Y: the docstring", "other code") == QUERY_IS_RELEVANT
    assert keys.rule("other text", "other code") is None


def test_codesearchnet_read_both_ways_trains_no_test_pair(fixture_root):
    """Both sources read the same CoIR pairs (text, code); CodeSearchNetRetrieval reads them swapped. A test
    split holding the pair (text, code) must drop it from both sources, in either direction."""
    text, code = "compute the area of a circle", "def area(r):\n    return 3.14159 * r * r"
    task = CoirLikeTask({"t0": text}, {"d0": ("", code)}, {"t0": {"d0": 1}})
    names = ["CodeSearchNetRetrieval", "COIRCodeSearchNetRetrieval"]
    prepared = prepare_sources(names, local_root=fixture_root, mteb_keys=mteb_test_keys([task]))
    pairs = {(r["query"], r["positive"]) for r in prepared.rows}
    assert (text, code) not in pairs and (code, text) not in pairs
    assert text not in prepared.rows["query"] and text not in prepared.rows["positive"]
    dropped = prepared.decontamination()  # the fixture asks the same text in each of the 6 languages
    assert dropped["COIRCodeSearchNetRetrieval"] == dict.fromkeys(dropped["COIRCodeSearchNetRetrieval"], 0) | {
        QUERY_IS_TEST_QUERY: 6
    }
    # was: every swapped row trained, the test pair (code, text) among them
    assert dropped["CodeSearchNetRetrieval"] == dict.fromkeys(dropped["CodeSearchNetRetrieval"], 0) | {
        QUERY_IS_RELEVANT: 1,  # (code, text): the test pair backwards
        POSITIVE_IS_TEST_QUERY: 5,  # the test query trained as the answer to other code
    }


def test_a_cap_per_group_after_decontamination_is_counted_apart(fixture_root):
    stage = DataStage(data_source="hub", hub_sources=NAMES, num_negatives=0, rows_per_group=1)
    prepared, _ = build_training_data(stage, fixture_root)
    sources = prepared.summary()["sources"]
    assert sum(s["kept"] for s in sources.values()) == len(prepared.rows) == 9  # was 18: the rows before the cap
    for name, counts in sources.items():
        groups = len(set(prepared.rows.filter(lambda r, n=name: r["dataset"] == n)["language"]))
        assert counts["kept"] == groups and counts["capped"] == counts["passed_checks"] - groups, name
    every = DataStage(data_source="hub", hub_sources=NAMES, num_negatives=0, rows_per_group=None)
    uncapped, _ = build_training_data(every, fixture_root)
    assert prepared.fingerprint != uncapped.fingerprint  # the cap is part of what was prepared


def test_build_refuses_options_it_would_ignore(fixture_root):
    with pytest.raises(DataError, match="local_root=.* reads hub sources, but data_source is 'offline'"):
        build_training_data(DataStage(), local_root=fixture_root)
    with pytest.raises(DataError, match="mteb_tasks were given .* but decontaminate_mteb is false"):
        build_training_data(DataStage(), mteb_tasks=[MockRetrievalTask()])


BEIR_PAIRS = [
    {"query": "read a json file", "pos": ["def load_json(p):\n    return json.load(open(p))"]},  # a BEIR query
    {"query": "parse a json file", "pos": ["def load(path):\n    return json.load(open(path))"]},  # d1, bare
    {"query": "def save(path, obj):\n    json.dump(obj, open(path, 'w'))", "pos": ["write a json file"]},  # backwards
    {"query": "subtract two numbers", "pos": ["def minus(a, b):\n    return a - b"]},  # d4: judged, not relevant
    {"query": "a training query that no test judgement names", "pos": ["def t():\n    pass"]},
    {"query": "kept", "pos": ["def kept():\n    pass"], "neg": ["def add(a, b):\n    return a + b", "def n(): 1"]},
]


def test_a_files_run_does_not_train_on_the_beir_sets_it_scores(tmp_path):
    """A BEIR set built from the run's own pairs (notebook 04's `beir_sets`, notebook 01's too): a training row goes
    when its query or positive is a judged query or a relevant document of the set (as the model sees it or bare),
    either way round; an own negative that is one is dropped; judged-irrelevant and unjudged texts stay."""
    from test_beir import CORPUS, write_set
    from test_data_files import write_jsonl

    corpus = [*CORPUS[:3], {"_id": "d4", "text": "def minus(a, b):\n    return a - b"}]  # q5 judges it 0
    folder = str(write_set(tmp_path / "my-set", corpus))
    path = write_jsonl(tmp_path / "pairs.jsonl", BEIR_PAIRS)
    stage = DataStage(data_source="files", data_files=[str(path)], files_heldout_fraction=0.0, num_negatives=1,
                      beir_sets=[folder])  # fmt: skip
    prepared, _ = build_training_data(stage)
    assert sorted(prepared.rows["query"]) == ["a training query that no test judgement names", "kept",
                                              "subtract two numbers"]  # was: all 6 trained, 0 dropped  # fmt: skip
    assert prepared.decontamination()["pairs"] == dict.fromkeys(RULES, 0) | {BEIR_TEXT: 3}
    assert prepared.summary()["beir_sets"] == [folder] and "3 BEIR set text" in prepared.lines()[0]
    assert prepared.origin["files"][0]["evaluated_negatives_dropped"] == 1  # `add` is relevant to a BEIR query
    assert "def add(a, b):\n    return a + b" not in {n for negs in prepared.rows["negatives"] for n in negs}
    with pytest.raises(DataError, match=r"BEIR set '.*missing' .*no such folder"):  # read as strictly as in 04
        build_training_data(DataStage(data_source="files", data_files=[str(path)], beir_sets=[folder + "-missing"]))


def test_every_source_is_decontaminated_against_the_beir_sets(tmp_path, fixture_root):
    """The hub sources, the offline snapshot and a code run drop a row whose query is a BEIR query, counted under
    "BEIR set text"; a run without `beir_sets` lists no such rule."""
    from test_beir import write_set
    from test_code_trees import FIXTURE

    def beir_of(name: str, query: str) -> str:
        corpus, queries = [{"_id": "d", "text": "an unrelated document"}], [{"_id": "q", "text": query}]
        return str(write_set(tmp_path / name, corpus, queries, "query-id\tcorpus-id\tscore\nq\td\t1\n"))

    every = {"num_negatives": 0, "rows_per_group": None}  # every row: the one named below cannot be capped away
    hub, _ = build_training_data(DataStage(data_source="hub", hub_sources=NAMES, **every), fixture_root)
    offline = next(r for r in load_snapshot() if r["split"] == "train")
    code = next(r for r in mine([FIXTURE]) if r["split"] == "train")
    stages = {
        "hub": (DataStage(data_source="hub", hub_sources=NAMES, **every), hub.rows[0]),
        "offline": (DataStage(**every), offline),
        "code": (DataStage(data_source="code", code_roots=[str(FIXTURE)], **every), code),
    }
    for name, (stage, row) in stages.items():
        plain, _ = build_training_data(stage, fixture_root if name == "hub" else None)
        assert BEIR_TEXT not in plain.decontamination()[row["dataset"]]
        stage.beir_sets = [beir_of(name, row["query"])]
        prepared, _ = build_training_data(stage, fixture_root if name == "hub" else None)
        dropped = prepared.decontamination()[row["dataset"]][BEIR_TEXT]
        same = zip(plain.rows["dataset"], plain.rows["query"], strict=True)
        assert dropped == sum(s == row["dataset"] and q == row["query"] for s, q in same) >= 1, name  # was: no rule
        assert row["query"] not in prepared.rows["query"], name


def test_beir_sets_reach_notebooks_01_and_04_alike():
    from c2llm_lib.params import resolve

    resolved = resolve({"beir_sets": ["../my-set"]}, "p.yaml")
    assert resolved["01_data_prep"]["beir_sets"] == resolved["04_eval_mteb_code"]["beir_sets"] == ["../my-set"]
    with pytest.raises(ConfigError, match=r"p.yaml \(notebook 01_data_prep\): parameter 'beir_sets' repeats"):
        resolve({"beir_sets": ["a", "a"]}, "p.yaml")
