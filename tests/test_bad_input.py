"""Hostile source files, one table row per problem: a bad line or qrel is a counted skip that names its file and
line (or qrel and value) while the other rows are kept; a file that cannot give any row is a DataError naming the
source, the file and its config. Never a raw decoding or parsing error, never a silently lost source."""

import json
import tracemalloc

import pytest

from c2llm_lib.data import SOURCES, DataError, RowChecker, SkipReport, iter_records
from c2llm_lib.data.sources import index_ids, open_table

from source_fixtures import write, write_fixtures

APPS = SOURCES["AppsRetrieval"]
BASE = "CoIR-Retrieval__apps"
CORPUS = {"d0": "def area(r):\n    return 3.14159 * r * r", "d1": "def greet(name):\n    return 'hi ' + name"}
QUERIES = {"q0": "compute the area of a circle", "q1": "say hello to someone by name"}
MISSING = "qrel names a missing query or document"
UTF8, JSON_LINE, NOT_OBJECT = "line with invalid UTF-8", "line with malformed JSON", "line that is not a JSON object"
NON_NUMERIC = "qrel with a non-numeric score"


def line(**row) -> bytes:
    return json.dumps(row).encode()


def qrel(q: str, c: str, score=1) -> bytes:
    return line(**{"query-id": q, "corpus-id": c, "score": score})


@pytest.fixture
def apps(tmp_path):
    """AppsRetrieval laid out like the hub. corpus.jsonl: d0, d1; queries.jsonl: q0, q1; train.jsonl (qrels):
    q0->d0, q1->d1, q0->d1 (score 0, not a pair). Two good pairs."""
    base = tmp_path / BASE
    write(base / "corpus" / "corpus.jsonl", [{"_id": i, "title": "", "text": t} for i, t in CORPUS.items()])
    write(base / "queries" / "queries.jsonl", [{"_id": i, "text": t} for i, t in QUERIES.items()])
    qrels = [("q0", "d0", 1), ("q1", "d1", 1), ("q0", "d1", 0)]
    write(base / "default" / "train.jsonl", [{"query-id": q, "corpus-id": c, "score": s} for q, c, s in qrels])
    return tmp_path


def put_line(path, number: int, raw: bytes) -> None:
    """Line `number` (1-based) of the file becomes `raw`; one past the end appends it."""
    lines = path.read_bytes().splitlines()
    if number == len(lines) + 1:
        lines.append(raw)
    else:
        lines[number - 1] = raw
    path.write_bytes(b"\n".join(lines) + b"\n")


def read_apps(root) -> tuple[list[dict], SkipReport]:
    report = SkipReport()
    return list(iter_records(APPS, RowChecker(report), root)), report


# (case, file under the source, line, new content, rows kept, skips by reason, text the report must show)
SKIPPED = [
    ("bad byte in a corpus text", "corpus/corpus.jsonl", 2, b'{"_id": "d1", "title": "", "text": "gr\xff"}',
     1, {UTF8: 1, MISSING: 1}, f"{BASE}/corpus/corpus.jsonl:2 (byte 0xff at column 39)"),
    ("bad byte in a query", "queries/queries.jsonl", 1, b'{"_id": "q0", "text": "\xc3("}',
     1, {UTF8: 1, MISSING: 1}, f"{BASE}/queries/queries.jsonl:1 (byte 0xc3"),
    ("bad byte in a qrel", "default/train.jsonl", 2, b'{"query-id": "q1", "corpus-id": "d1", "note": "\xfe"}',
     1, {UTF8: 1}, f"{BASE}/default/train.jsonl:2"),
    ("truncated JSON line in the corpus", "corpus/corpus.jsonl", 2, b'{"_id": "d1", "text": "def gr',
     1, {JSON_LINE: 1, MISSING: 1}, f"{BASE}/corpus/corpus.jsonl:2 (Invalid control character at column 30)"),
    ("JSON array instead of an object", "queries/queries.jsonl", 2, b'["q1", "say hello"]',
     1, {NOT_OBJECT: 1, MISSING: 1}, f"{BASE}/queries/queries.jsonl:2 (a JSON list)"),
    ("qrel score 'high'", "default/train.jsonl", 1, qrel("q0", "d0", "high"),
     1, {NON_NUMERIC: 1}, f"train:q0->d0 score 'high' at {BASE}/default/train.jsonl:1"),
    ("qrel score ''", "default/train.jsonl", 2, qrel("q1", "d1", ""),
     1, {NON_NUMERIC: 1}, f"train:q1->d1 score '' at {BASE}/default/train.jsonl:2"),
    ("qrel score NaN", "default/train.jsonl", 1, b'{"query-id": "q0", "corpus-id": "d0", "score": NaN}',
     1, {NON_NUMERIC: 1}, "train:q0->d0 score nan"),
    ("qrel without a corpus-id", "default/train.jsonl", 1, line(**{"query-id": "q0", "score": 1}),
     1, {"qrel without a query-id or corpus-id": 1}, f"{BASE}/default/train.jsonl:1"),
    ("corpus id repeated with another text", "corpus/corpus.jsonl", 3, line(_id="d0", title="", text="def other(): 1"),
     2, {"duplicate corpus id with a different text (the first is used)": 1},
     f"d0 at {BASE}/corpus/corpus.jsonl:3 (first at line 1)"),
    ("query id repeated with another text", "queries/queries.jsonl", 3, line(_id="q1", text="another question"),
     2, {"duplicate query id with a different text (the first is used)": 1},
     f"q1 at {BASE}/queries/queries.jsonl:3 (first at line 2)"),
    ("corpus id repeated with the same text", "corpus/corpus.jsonl", 3, line(_id="d1", title="", text=CORPUS["d1"]),
     2, {"repeated corpus id with the same text": 1}, f"d1 at {BASE}/corpus/corpus.jsonl:3"),
    ("qrel score null means relevant", "default/train.jsonl", 1, qrel("q0", "d0", None),
     2, {}, "AppsRetrieval: passed checks 2"),
]  # fmt: skip


@pytest.mark.parametrize(("file", "number", "raw", "kept", "skipped", "shown"), [c[1:] for c in SKIPPED],
                         ids=[c[0] for c in SKIPPED])  # fmt: skip
def test_a_bad_row_is_skipped_counted_and_named(apps, file, number, raw, kept, skipped, shown):
    put_line(apps / BASE / file, number, raw)
    rows, report = read_apps(apps)
    assert len(rows) == kept and report.passed[APPS.name] == kept  # the other rows survive
    assert dict(report.skipped[APPS.name]) == skipped
    assert shown in "\n".join(report.lines())
    for row in rows:  # kept rows are intact; a repeated id keeps its first text
        assert row["query"] in QUERIES.values() and row["positive"] in CORPUS.values()


# (case, file under the source, whole content, the DataError's message)
FAILS = [
    ("empty corpus file", "corpus/corpus.jsonl", b"",
     rf"source AppsRetrieval: the corpus file \S+/{BASE}/corpus/corpus\.jsonl \(config 'corpus', split 'corpus'\) "
     "holds no rows"),
    ("queries file of blank lines", "queries/queries.jsonl", b"\n\n",
     rf"source AppsRetrieval: the queries file \S+/{BASE}/queries/queries\.jsonl \(config 'queries', "
     r"split 'queries'\) holds no rows"),
    ("empty qrels file", "default/train.jsonl", b"",
     rf"source AppsRetrieval: the qrels\[train\] file \S+/{BASE}/default/train\.jsonl \(config 'default', "
     r"split 'train'\) holds no rows"),
    ("corpus file of binary garbage", "corpus/corpus.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00\xff",
     rf"source AppsRetrieval: the corpus file \S+/{BASE}/corpus/corpus\.jsonl \(config 'corpus', split 'corpus'\) "
     r"is unreadable: none of its 3 line\(s\) is a JSON object \(first: line 1: line with invalid UTF-8"),
    ("queries file that is one JSON array", "queries/queries.jsonl", b'[{"_id": "q0", "text": "x"}]\n',
     r"the queries file .* is unreadable: none of its 1 line\(s\) is a JSON object \(first: line 1: line that is"),
]  # fmt: skip


@pytest.mark.parametrize(("file", "content", "message"), [c[1:] for c in FAILS], ids=[c[0] for c in FAILS])
def test_a_file_without_rows_is_an_error_naming_source_config_and_file(apps, file, content, message):
    (apps / BASE / file).write_bytes(content)
    with pytest.raises(DataError, match=message):
        read_apps(apps)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_bad_line_in_any_layout_loses_only_that_line(tmp_path, name):
    source = SOURCES[name]
    root = write_fixtures(tmp_path)
    clean = SkipReport()
    expected = len(list(iter_records(source, RowChecker(clean), root)))
    first = source.languages[0]
    folder = {"pairs": first, "coir_multilang": f"{first}-qrels", "coir": "default"}[source.layout]
    path = root / source.hub_id.replace("/", "__") / folder / "train.jsonl"
    number = len(path.read_bytes().splitlines()) + 1
    put_line(path, number, b'{"query-id": "q0", "corpus-id": "d0", "instruction": "\xff\xfe", "diff": "+ x"}')
    report = SkipReport()
    assert len(list(iter_records(source, RowChecker(report), root))) == expected
    assert report.skipped[name][UTF8] == 1
    assert dict(report.skipped[name]) == {**clean.skipped[name], UTF8: 1}
    assert f"{path.relative_to(root).as_posix()}:{number} (byte 0xff" in "\n".join(report.lines())


@pytest.fixture
def fake_hub(monkeypatch):
    """`datasets.load_dataset` answers AppsRetrieval's configs from in-memory tables (no hub here)."""
    import datasets

    tables = {
        "corpus": {"_id": ["d0", "d1", "d0"], "title": ["", "", ""], "text": [*CORPUS.values(), "def other(): 1"]},
        "queries": {"_id": ["q0", "q1"], "text": list(QUERIES.values())},
        "default": {"query-id": ["q0", "q1", "q1"], "corpus-id": ["d0", "d1", "d0"], "score": ["1", "1", "high"]},
    }

    def load_dataset(hub_id, config, revision, split, data_dir=None):
        return datasets.Dataset.from_dict(tables[config])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return tables


def test_hub_tables_get_the_same_checks(fake_hub):
    rows, report = read_apps(None)
    assert [r["positive"] for r in rows] == list(CORPUS.values())  # d0 keeps its first text
    assert dict(report.skipped[APPS.name]) == {
        "duplicate corpus id with a different text (the first is used)": 1,
        NON_NUMERIC: 1,
    }
    shown = "\n".join(report.lines())
    assert "d0 at corpus row 2 (first at row 0)" in shown and "train:q1->d0 score 'high' at qrels[train] row 2" in shown


def test_an_empty_hub_table_is_an_error(fake_hub):
    fake_hub["queries"] = {"_id": [], "text": []}
    with pytest.raises(DataError, match=r"source AppsRetrieval: the queries table CoIR-Retrieval/apps@f22508f9 "
                       r"config 'queries' split 'queries' holds no rows"):  # fmt: skip
        read_apps(None)


def test_indexing_a_local_corpus_keeps_offsets_not_texts(tmp_path):
    """A 20 MB corpus is indexed in well under 20 MB: texts stay on disk and are read back per qrel chunk."""
    n, text = 5_000, "x = 1\n" * 700  # about 4 KB per document
    path = tmp_path / BASE / "corpus" / "corpus.jsonl"
    write(path, [{"_id": f"d{i}", "title": "", "text": f"{text}{i}"} for i in range(n)])
    table = open_table(APPS, "corpus", "corpus", "corpus", tmp_path, SkipReport())
    tracemalloc.start()
    index = index_ids(table, "corpus", SkipReport())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(index) == n and peak < 3_000_000, peak
    assert table.values([index["d4321"], index["d7"]], "text") == [f"{text}4321", f"{text}7"]
