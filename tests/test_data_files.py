"""`data_source: files` (issue 24): a user's own pairs in every layout and format, groups, instructions and
languages, the held-out split, decontamination, every bad input named by file, row and column, and their negatives
kept (at most K) and topped up with mined ones, never a correct answer, while the hub and offline sources still have
every negative mined."""

import csv
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset, DatasetDict

from c2llm_lib.checks import ConfigError
from c2llm_lib.config import DataStage
from c2llm_lib.data import DataError
from c2llm_lib.data.build import build_training_data, offline_eval_texts
from c2llm_lib.data.decontamination import HELDOUT_TEXT, OFFLINE_EVAL_TEXT, QUERY_IS_TEST_QUERY, RULES, EvalKeys
from c2llm_lib.data.files import NOTEBOOK_DIR, is_heldout, prepare_files
from c2llm_lib.data.layouts import DEFAULT_LANGUAGE
from c2llm_lib.data.mix import Prepared, add_hard_negatives, fingerprint_of, prepare_rows
from c2llm_lib.data.negatives import mine_negatives, own_negatives, top_up_negatives
from c2llm_lib.data.records import SAME_TEXT, text_key
from c2llm_lib.entries import FileEntry, file_entries

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


# Reading the files: every layout and format, groups, instructions and languages, the held-out split,
# decontamination, and every bad input named by file, row and column.

FIXTURES = Path(__file__).parent / "fixtures"
OWN = FIXTURES / "own-pairs.jsonl"
DEFAULT = "Given a query, retrieve relevant code or text that answers it:"
CANON = [  # (query, positive, negatives): what every layout and format below holds
    ("read a file into a string", "def read(path):\n    return open(path).read()",
     ["def write(path, text):\n    open(path, 'w').write(text)", "def size(path):\n    return os.path.getsize(path)"]),
    ("404", "None", []),  # texts that a CSV reader would turn into a number and a missing value
    ("add two numbers", "def add(a, b):\n    return a + b", ["def sub(a, b):\n    return a - b"]),
]  # fmt: skip


def read(entries, fraction=0.0, **kwargs) -> Prepared:
    return prepare_files(file_entries(list(entries)), DEFAULT, fraction, **kwargs)


def triples(prepared: Prepared) -> list[tuple]:
    return sorted((r["query"], r["positive"], tuple(r["negatives"])) for r in prepared.rows)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([header, *rows])
    return path


def flag_rows() -> list[dict]:
    return [{"query": q, "pos": [p], "neg": n} for q, p, n in CANON]


def make_flag_jsonl(tmp: Path) -> Path:
    return write_jsonl(tmp / "flag.jsonl", flag_rows())


def make_plain_json(tmp: Path) -> Path:  # one JSON array, not JSON lines
    path = tmp / "plain.json"
    path.write_text(json.dumps([{"query": q, "positive": p, "negatives": n} for q, p, n in CANON]))
    return path


def make_st_jsonl(tmp: Path) -> Path:  # negative (one text) then negatives (a list), in that order
    rows = [{"anchor": q, "positive": p, "negative": n[0] if n else None, "negatives": n[1:]} for q, p, n in CANON]
    return write_jsonl(tmp / "st.jsonl", rows)


def make_st_csv(tmp: Path) -> Path:  # negative_1 .. negative_n (read by number, not column order), blank if fewer
    rows = [[q, p, *(n + ["", ""])[:2]] for q, p, n in CANON]
    return write_csv(
        tmp / "st.csv", ["anchor", "positive", "negative_2", "negative_1"], [r[:2] + r[:1:-1] for r in rows]
    )


def make_st_parquet(tmp: Path) -> Path:
    path = tmp / "st.parquet"
    Dataset.from_list([{"anchor": q, "positive": p, "negatives": n} for q, p, n in CANON]).to_parquet(str(path))
    return path


def make_saved(tmp: Path) -> Path:
    Dataset.from_list(flag_rows()).save_to_disk(str(tmp / "saved"))
    return tmp / "saved"


def make_saved_dict(tmp: Path) -> Path:
    other = Dataset.from_list([{"query": "not this split", "pos": ["x"], "neg": []}])
    DatasetDict({"train": Dataset.from_list(flag_rows()), "validation": other}).save_to_disk(str(tmp / "dict"))
    return tmp / "dict"


def make_folder(tmp: Path) -> Path:
    write_jsonl(tmp / "pairs" / "a.jsonl", flag_rows()[:1])
    write_csv(tmp / "pairs" / "b.csv", ["query", "positive"], [[q, p] for q, p, _ in CANON[1:2]])
    Dataset.from_list([{"query": q, "positive": p, "negatives": n} for q, p, n in CANON[2:]]).to_parquet(
        str(tmp / "pairs" / "c.parquet")
    )
    (tmp / "pairs" / "notes.txt").write_text("not data")
    return tmp / "pairs"


MAKERS = [make_flag_jsonl, make_plain_json, make_st_jsonl, make_st_csv, make_st_parquet, make_saved,
          make_saved_dict, make_folder]  # fmt: skip
ST = "sentence-transformers"
LAYOUT_OF = {"make_flag_jsonl": "FlagEmbedding", "make_plain_json": "query/positive", "make_st_jsonl": ST,
             "make_st_csv": ST, "make_st_parquet": ST, "make_saved": "FlagEmbedding",
             "make_saved_dict": "FlagEmbedding"}  # fmt: skip


@pytest.mark.parametrize("make", MAKERS, ids=lambda f: f.__name__[5:])
def test_every_layout_and_format_reads_the_same_pairs(tmp_path, make):
    path = make(tmp_path)
    prepared = read([str(path)])
    assert triples(prepared) == sorted((q, p, tuple(n)) for q, p, n in CANON)
    assert set(prepared.rows["instruction"]) == {DEFAULT} and set(prepared.rows["language"]) == {"mixed"}
    assert prepared.heldout is None
    files = prepared.origin["files"]
    if make.__name__ in LAYOUT_OF:
        assert [f["layout"] for f in files] == [LAYOUT_OF[make.__name__]]
        assert files[0]["group"] == path.stem and set(prepared.rows["dataset"]) == {path.stem}
    else:  # a folder of files: one group per file, the text file ignored and said so
        assert [(f["given"], f["format"]) for f in files] == [
            (f"{path}/a.jsonl", "json"), (f"{path}/b.csv", "csv"), (f"{path}/c.parquet", "parquet")]  # fmt: skip
        assert sorted(set(prepared.rows["dataset"])) == ["a", "b", "c"]
        assert any("ignored (not .jsonl, .json, .csv, .parquet): ['notes.txt']" in n for n in prepared.report.notes)


def test_the_flagembedding_fixture(tmp_path):
    prepared = read([str(OWN)])
    lines = [json.loads(line) for line in OWN.read_text().splitlines()]
    assert len(lines) == 38 and len(prepared.rows) == 39  # one row has two positives: one record each
    by_language = {lang: prepared.rows["language"].count(lang) for lang in ("python", "javascript")}
    assert by_language == {"python": 21, "javascript": 18} and set(prepared.rows["dataset"]) == {"own-pairs"}
    two = [r for r in prepared.rows if r["query"] == "count how often each word occurs in a text"]
    assert [r["positive"] for r in two] == lines[2]["pos"] and two[0]["negatives"] == two[1]["negatives"] == lines[2][
        "neg"
    ]
    for line in lines:
        rows = [r for r in prepared.rows if r["query"] == line["query"]]
        assert {r["instruction"] for r in rows} == {line.get("prompt", DEFAULT)}
        assert all(r["negatives"] == (line.get("neg") or []) for r in rows)
    file = prepared.origin["files"][0]
    assert file["sha256"] == hashlib.sha256(OWN.read_bytes()).hexdigest() and file["layout"] == "FlagEmbedding"
    assert file["instruction_from"] == {"row": 4, "default": 34} and prepared.origin["default_instruction"] == DEFAULT
    assert f"34 the run's files_instruction {DEFAULT!r}" in "\n".join(prepared.report.lines())
    assert prepared.summary()["origin"]["files"][0]["rows"] == 38


def test_groups_come_from_the_entry_the_stem_or_a_column(tmp_path):
    write_jsonl(tmp_path / "a" / "train.jsonl", [{"query": "q1", "pos": ["p1"]}])
    write_jsonl(tmp_path / "b" / "train.jsonl", [{"query": "q2", "pos": ["p2"]}])
    write_jsonl(tmp_path / "named.jsonl", [{"query": "q3", "pos": ["p3"]}])
    write_jsonl(tmp_path / "tasks.jsonl", [{"query": f"q{i}", "pos": [f"p{i}"], "task": t}
                                           for i, t in enumerate(["sql", "sql", "shell", 7], start=4)])  # fmt: skip
    prepared = read([str(tmp_path / "a" / "train.jsonl"), str(tmp_path / "b" / "train.jsonl"),
                     {"path": str(tmp_path / "named.jsonl"), "group": "train-2"},
                     {"path": str(tmp_path / "tasks.jsonl"), "group": {"column": "task"}}])  # fmt: skip
    group_of = dict(zip(prepared.rows["query"], prepared.rows["dataset"], strict=True))
    assert group_of == {"q1": "train", "q2": "train-3", "q3": "train-2", "q4": "sql", "q5": "sql", "q6": "shell",
                        "q7": "7"}  # fmt: skip
    assert f"{tmp_path}/b/train.jsonl is group 'train-3': 'train' is already {tmp_path}/a/train.jsonl's group" in (
        "\n".join(prepared.report.notes)
    )
    with pytest.raises(DataError, match=r"tasks.jsonl: no column 'kind' to group by \(data_files entry 0's group\)"):
        read([{"path": str(tmp_path / "tasks.jsonl"), "group": {"column": "kind"}}])


def test_instruction_and_language_come_from_the_row_the_entry_or_the_default(tmp_path):
    rows = [
        {"query": "own both", "positive": "p1", "instruction": "Row instruction:", "language": " Python "},
        {"query": "own none", "positive": "p2", "instruction": "  ", "language": None},
        {"query": "bad language", "positive": "p3", "language": "cobol"},
    ]
    path = write_jsonl(tmp_path / "x.jsonl", rows)
    plain = read([str(path)])
    entry = read([{"path": str(path), "instruction": "Entry instruction:", "language": "sql"}])
    got = {r["query"]: (r["instruction"], r["language"]) for r in plain.rows}
    assert got == {"own both": ("Row instruction:", "python"), "own none": (DEFAULT, DEFAULT_LANGUAGE)}
    got = {r["query"]: (r["instruction"], r["language"]) for r in entry.rows}
    assert got == {"own both": ("Row instruction:", "python"), "own none": ("Entry instruction:", "sql")}
    assert plain.report.as_dict()["x"]["examples"] == {
        "unknown language 'cobol' in column 'language'": [f"{path} row 2"]
    }


def write_bad_rows(path: Path) -> Path:
    return write_jsonl(path, [
        {"id": "a", "query": "read a file", "pos": ["def read(p):\n    return open(p).read()"], "neg": ["def w(): 1"]},
        {"id": "b", "query": 42, "pos": ["x"]},
        {"id": "c", "query": "q", "pos": "not a list"},
        {"id": "a", "query": "a repeated id", "pos": ["y"]},
        {"id": "e", "query": "a number among negatives", "pos": ["z"], "neg": ["ok", 3]},
        {"id": "f", "query": "negatives as a text", "pos": ["z2"], "neg": "n"},
        {"id": "g", "query": "   ", "pos": ["z4"]},
        {"id": "h", "query": "no positive", "pos": []},
        {"id": "i", "query": "an empty positive", "pos": ["fine", ""]},
        {"id": ["j"], "query": "a list id", "pos": ["z5"]},
        {"id": "k", "query": "a non-text prompt", "pos": ["z6"], "prompt": 7},
        {"id": "l", "query": "read a file", "pos": ["def read(p):\n    return   open(p).read()"]},  # a duplicate pair
    ])  # fmt: skip


def test_bad_rows_are_counted_naming_the_file_row_id_and_column(tmp_path):
    path = write_bad_rows(tmp_path / "bad.jsonl")
    prepared = read([str(path)])
    assert len(prepared.rows) == 1
    report = prepared.report.as_dict()["bad"]
    assert report["passed_checks"] == 1 and sum(report["skipped"].values()) == 11
    assert report["examples"] == {
        "non-text value in column 'query'": [f"{path} row 1 (id 'b')"],
        "not a list of texts in column 'pos'": [f"{path} row 2 (id 'c')"],
        "duplicate id in column 'id'": [f"{path} row 3 (id 'a', first at row 0)"],
        "a non-text or empty item in column 'neg'": [f"{path} row 4 (id 'e')"],
        "not a list of texts in column 'neg'": [f"{path} row 5 (id 'f')"],
        "empty text in column 'query'": [f"{path} row 6 (id 'g')"],
        "no positive in column 'pos'": [f"{path} row 7 (id 'h')"],
        "a non-text or empty item in column 'pos'": [f"{path} row 8 (id 'i')"],
        "an id that is not a text or an integer in column 'id'": [f"{path} row 9"],
        "non-text value in column 'prompt'": [f"{path} row 10 (id 'k')"],
        "duplicate row": [f"{path} row 11 (id 'l')"],
    }
    assert prepared.origin["files"][0]["skipped"] == 10  # the duplicate pair is RowChecker's, counted per group


def test_a_row_of_invalid_utf8_is_counted_not_the_loss_of_its_file(tmp_path):
    path = tmp_path / "u.jsonl"
    path.write_bytes(b'{"query": "a", "pos": ["b"]}\n{"query": "c", "pos": ["d\xff"]}\n{"query": "e", "pos": ["f"]}\n')
    prepared = read([str(path)])
    assert prepared.rows["query"] == ["a", "e"]
    assert prepared.report.as_dict()["u"]["examples"] == {"invalid UTF-8 in column 'pos'": [f"{path} row 1"]}


def _bad_file(tmp: Path, case: str) -> tuple[object, str]:
    """(data_files entry, the error it must raise) for each way a file can be unusable."""
    if case == "missing relative":
        where = re.escape(str(NOTEBOOK_DIR))
        relative = rf"relative paths are resolved from {where}, where notebooks run"
        return "no/such.jsonl", rf"'no/such.jsonl' does not exist \(looked for {where}/no/such.jsonl; {relative}\)"
    if case == "empty jsonl":
        (tmp / "e.jsonl").write_bytes(b"")
        return str(tmp / "e.jsonl"), r"e.jsonl is empty"
    if case == "blank jsonl":
        (tmp / "b.jsonl").write_text("\n\n")
        return str(tmp / "b.jsonl"), r"b.jsonl holds no rows"
    if case == "header-only csv":
        (tmp / "h.csv").write_text("anchor,positive\n")
        return str(tmp / "h.csv"), r"h.csv holds no rows"
    if case == "empty parquet":
        (tmp / "e.parquet").write_bytes(b"")
        return str(tmp / "e.parquet"), r"e.parquet is empty"
    if case == "garbage parquet":
        (tmp / "g.parquet").write_bytes(b"not parquet at all")
        return str(tmp / "g.parquet"), r"g.parquet cannot be read as parquet: ArrowInvalid: Parquet magic bytes"
    if case == "malformed jsonl":
        (tmp / "m.jsonl").write_text('{"query": "a", "pos": ["b"]}\n{"query": "c", "pos": [\n')
        return str(tmp / "m.jsonl"), r"m.jsonl cannot be read as json \(line 2: line with malformed JSON"
    if case == "only invalid utf-8":
        (tmp / "u.jsonl").write_bytes(b'{"query": "\xff", "pos": ["b"]}\n')
        return str(tmp / "u.jsonl"), r"u.jsonl: none of its 1 rows is usable \(1 invalid UTF-8 in column 'query'\)"
    if case == "no layout":
        write_jsonl(tmp / "n.jsonl", [{"question": "a", "answer": "b"}])
        columns = r"its columns \['answer', 'question'\] match no layout"
        return str(tmp / "n.jsonl"), r"n.jsonl: " + columns + r"; expected FlagEmbedding \(query, pos"
    if case == "two layouts":
        write_jsonl(tmp / "t.jsonl", [{"query": "a", "pos": ["b"], "positive": "b"}])
        return str(tmp / "t.jsonl"), r"t.jsonl: .* match more than one layout \(FlagEmbedding, query/positive\)"
    if case == "prompt and instruction":
        write_jsonl(tmp / "p.jsonl", [{"query": "a", "pos": ["b"], "prompt": "x", "instruction": "y"}])
        return str(tmp / "p.jsonl"), r"p.jsonl: it has both a 'prompt' and an 'instruction' column"
    if case == "repeated csv column":
        write_csv(tmp / "r.csv", ["anchor", "positive", "positive"], [["a", "b", "c"]])
        return str(tmp / "r.csv"), r"r.csv: its header repeats the column\(s\) \['positive'\]"
    if case == "ragged csv":
        (tmp / "x.csv").write_text("anchor,positive\na,b,c\n")
        return str(tmp / "x.csv"), r"x.csv cannot be read as csv: ParserWarning: Length of header"
    if case == "folder without data":
        (tmp / "docs").mkdir()
        (tmp / "docs" / "readme.md").write_text("hi")
        return str(tmp / "docs"), r"the folder .*docs.* holds no data file .* it holds \['readme.md'\]"
    if case == "unknown suffix":
        (tmp / "pairs.tsv").write_text("a\tb\n")
        return str(tmp / "pairs.tsv"), r"'.*pairs.tsv' is not a .jsonl, .json, .csv, .parquet file"
    if case == "no usable row":
        write_jsonl(tmp / "z.jsonl", [{"query": "", "pos": ["b"]}, {"query": "c", "pos": "d"}])
        reasons = r"\(1 empty text in column 'query', 1 not a list of texts in column 'pos'\)"
        return str(tmp / "z.jsonl"), r"z.jsonl: none of its 2 rows is usable " + reasons
    if case == "two splits":
        rows = Dataset.from_list(flag_rows())
        DatasetDict({"a": rows, "b": rows}).save_to_disk(str(tmp / "d"))
        return str(tmp / "d"), r"d is a DatasetDict with splits \['a', 'b'\]: save one split, or one named train"
    raise AssertionError(case)


BAD_FILES = ["missing relative", "empty jsonl", "blank jsonl", "header-only csv", "empty parquet", "garbage parquet",
             "malformed jsonl", "only invalid utf-8", "no layout", "two layouts", "prompt and instruction",
             "repeated csv column", "ragged csv", "folder without data", "unknown suffix", "no usable row",
             "two splits"]  # fmt: skip


@pytest.mark.parametrize("case", BAD_FILES)
def test_an_unusable_file_is_an_error_naming_it(tmp_path, case):
    entry, message = _bad_file(tmp_path, case)
    with pytest.raises(DataError, match=message):
        read([entry])


def test_one_file_named_twice_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", flag_rows())
    (tmp_path / "link.jsonl").symlink_to(path)
    with pytest.raises(DataError, match=r"data_files entries 0 and 1 both read .*link.jsonl .*would count twice"):
        read([str(path), str(tmp_path / "link.jsonl")])


def test_a_file_name_with_glob_characters_reads_that_file(tmp_path):
    """`datasets` reads data_files as patterns: `a[1].jsonl` would otherwise read `a1.jsonl`."""
    write_jsonl(tmp_path / "a[1].jsonl", [{"query": "the bracketed file", "pos": ["x"]}])
    write_jsonl(tmp_path / "a1.jsonl", [{"query": "another file", "pos": ["y"]}])
    write_jsonl(tmp_path / "b*.jsonl", [{"query": "the starred file", "pos": ["z"]}])
    write_jsonl(tmp_path / "bb.jsonl", [{"query": "yet another file", "pos": ["w"]}])
    assert read([str(tmp_path / "a[1].jsonl")]).rows["query"] == ["the bracketed file"]
    assert read([str(tmp_path / "b*.jsonl")]).rows["query"] == ["the starred file"]


def _tree(root: Path) -> dict[str, tuple]:
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}  # fmt: skip


def test_reading_writes_nothing_into_the_users_folders_or_datasets_cache(tmp_path, monkeypatch):
    import datasets

    data = tmp_path / "data"
    data.mkdir()
    for make in (make_flag_jsonl, make_st_csv, make_st_parquet, make_saved, make_saved_dict, make_folder):
        make(data)
    (data / "own-pairs.jsonl").write_bytes(OWN.read_bytes())
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    before = _tree(data)
    names = ("flag.jsonl", "st.csv", "st.parquet", "saved", "dict", "pairs", "own-pairs.jsonl")
    stage = DataStage(data_source="files", data_files=[str(data / n) for n in names], num_negatives=1)
    prepared, _ = build_training_data(stage)
    assert len(prepared.rows) > 0 and prepared.heldout is not None
    assert _tree(data) == before  # the same files, bytes and times: nothing written, nothing added
    assert list(cache.iterdir()) == []


def test_an_edited_file_is_read_again_not_served_from_a_cache(tmp_path):
    """`datasets` keys a local file by its path and mtime: an edit that keeps both (a copy with `cp -p`, two writes in
    one clock tick) would be served stale from its cache. Each read here converts the file afresh."""
    path = write_jsonl(tmp_path / "own.jsonl", [{"query": "first version", "pos": ["aaaa"]}])
    stat = path.stat()
    assert read([str(path)]).rows["positive"] == ["aaaa"]
    write_jsonl(path, [{"query": "first version", "pos": ["bbbb"]}])  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same modification time
    again = read([str(path)])
    assert again.rows["positive"] == ["bbbb"] and again.origin["files"][0]["sha256"] != hashlib.sha256(b"").hexdigest()


def _many_rows(n: int) -> list[dict]:
    rows = [{"id": i, "query": f"how do I do task number {i}", "pos": [f"def task_{i}():\n    return {i}"]}
            for i in range(n)]  # fmt: skip
    rows += [{"id": n + i, "query": f"how  do I do task number {i}\n", "pos": [f"def other_{i}():\n    return -{i}"]}
             for i in range(0, n, 10)]  # whitespace variants of some queries: the same query  # fmt: skip
    return rows


def test_the_heldout_split_is_stable_and_disjoint_by_query(tmp_path):
    path = write_jsonl(tmp_path / "many.jsonl", _many_rows(200))
    first, second = read([str(path)], 0.25), read([str(path)], 0.25)
    assert first.heldout.to_list() == second.heldout.to_list() and first.fingerprint == second.fingerprint
    held = {text_key(q) for q in first.heldout["query"]}
    trained = {text_key(q) for q in first.rows["query"]}
    assert held and not held & trained and len(held) + len(trained) == 200
    assert 0.15 < len(held) / 200 < 0.35
    assert first.heldout.column_names == ["dataset", "language", "query", "positive", "negatives", "instruction",
                                          "file", "row"]  # fmt: skip
    lines = path.read_text().splitlines()
    for row in first.heldout:
        assert row["file"] == str(path) and json.loads(lines[row["row"]])["query"] == row["query"]
        assert is_heldout(row["query"], 0.25)
    variants = [r for r in first.heldout if "  " in r["query"]]
    assert variants and all(text_key(r["query"]) in held for r in variants)  # each with its original
    assert first.summary()["heldout_rows"] == len(first.heldout)
    assert read([str(path)], 0.0).heldout is None
    assert prepare_rows(lambda checker: iter([checker.record("s", "r", "q", "p", "python", "i")]), "fp").heldout is None


def _heldout_query(fraction: float, held: bool, start: int = 0) -> str:
    return next(q for i in range(start, 10_000) if is_heldout(q := f"find the helper number {i}", fraction) == held)


def test_training_rows_are_decontaminated_against_the_heldout_texts(tmp_path):
    shared = "def shared_helper(x):\n    return x * 2"
    held, kept, other = _heldout_query(0.2, True), _heldout_query(0.2, False), _heldout_query(0.2, False, 5_000)
    rows = [
        {"query": held, "pos": [shared]},
        {"query": kept, "pos": [shared]},  # its positive is a held-out positive: dropped
        {"query": shared, "pos": ["def caller():\n    return shared_helper(1)"]},  # its query is a held-out text
        {"query": other, "pos": ["def unrelated():\n    pass"], "neg": [shared, "def fine():\n    pass"]},
    ]
    prepared = read([str(write_jsonl(tmp_path / "d.jsonl", rows))], 0.2)
    assert prepared.heldout["query"] == [held]
    assert prepared.rows["query"] == [other] and prepared.rows["negatives"] == [["def fine():\n    pass"]]
    assert prepared.decontamination()["d"][HELDOUT_TEXT] == 2
    assert prepared.origin["files"][0]["evaluated_negatives_dropped"] == 1


def test_a_pair_whose_query_equals_its_positive_is_skipped_and_counted_held_out_or_not(tmp_path):
    """Equal after the decontamination's normalisation (whitespace): held out, every model, BM25 included, would
    find it (nDCG 100); trained, it teaches nothing. Each is a counted skip naming its file and row."""
    held, kept, other = _heldout_query(0.2, True), _heldout_query(0.2, False), _heldout_query(0.2, False, 5_000)
    rows = [
        {"query": held, "pos": [held.replace(" ", "  ") + "\n"]},  # held out
        {"query": kept, "pos": [" " + kept]},  # would train
        {"query": other, "pos": ["def other():\n    pass"]},
    ]
    path = write_jsonl(tmp_path / "same.jsonl", rows)
    prepared = read([str(path)], 0.2)
    assert prepared.rows["query"] == [other]  # was: [kept, other]
    assert len(prepared.heldout) == 0  # was: held out, a query that is its own answer
    report = prepared.report.as_dict()["same"]
    assert report["skipped"] == {SAME_TEXT: 1, f"{SAME_TEXT} (held out)": 1}
    assert report["examples"] == {SAME_TEXT: [f"{path} row 1"], f"{SAME_TEXT} (held out)": [f"{path} row 0"]}
    assert f"1 {SAME_TEXT}" in prepared.lines()[0]


def test_files_are_decontaminated_against_mteb_and_the_offline_sets(tmp_path):
    from test_data_decontamination import CoirLikeTask

    offline = offline_eval_texts()[0]
    rows = [
        {"query": "an mteb test query", "pos": ["def a():\n    pass"]},
        {"query": "an offline text as a query", "pos": [offline]},
        {"query": "kept", "pos": ["def kept():\n    pass"]},
        {"query": "kept too", "pos": ["def kept_too():\n    pass"]},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    task = CoirLikeTask({"t0": "an mteb test query"}, {"d0": ("", "def b():\n    pass")}, {"t0": {"d0": 1}})
    stage = DataStage(data_source="files", data_files=[str(path)], num_negatives=1, files_heldout_fraction=0.0,
                      decontaminate_mteb=True)  # fmt: skip
    prepared, _ = build_training_data(stage, mteb_tasks=[task])
    assert sorted(prepared.rows["query"]) == ["kept", "kept too"]
    rules = prepared.decontamination()["d"]
    assert rules[QUERY_IS_TEST_QUERY] == 1 and rules[OFFLINE_EVAL_TEXT] == 1
    assert HELDOUT_TEXT not in rules  # files_heldout_fraction 0: no held-out rule to count


def test_build_training_data_reads_files_keeps_their_negatives_and_holds_rows_out():
    stage = DataStage(data_source="files", data_files=["../tests/fixtures/own-pairs.jsonl"], num_negatives=2)
    prepared, short = build_training_data(stage)  # the path is relative to notebooks/
    assert prepared.heldout is not None and len(prepared.heldout) > 0 and short == {}
    lines = {json.loads(line)["query"]: json.loads(line) for line in OWN.read_text().splitlines()}
    held = {text_key(t) for r in prepared.heldout for t in (r["query"], r["positive"])}
    dropped = 0
    for row in prepared.rows:
        given = lines[row["query"]].get("neg") or []
        own = [n for n in given if text_key(n) not in held]  # a held-out text is never trained on, not even as this
        dropped += len(given) - len(own)
        assert len(row["negatives"]) == 2 and row["negatives"][: len(own)] == own[:2]
        assert row["positive"] not in row["negatives"] and not {text_key(n) for n in row["negatives"]} & held
    assert dropped == sum(f["evaluated_negatives_dropped"] for f in prepared.origin["files"]) > 0
    summary = prepared.summary()
    assert summary["origin"]["default_instruction"] == DEFAULT and summary["heldout_rows"] == len(prepared.heldout)
    assert any(DEFAULT in note for note in summary["notes"])
    capped, _ = build_training_data(DataStage(data_source="files", data_files=[str(OWN)], num_negatives=1,
                                              rows_per_group=5))  # fmt: skip
    assert len(capped.rows) == 10  # 5 per (dataset, language) group


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"data_files": [{"path": "a.jsonl", "grup": "x"}]},
         r"entry 0: unknown key 'grup' \(did you mean 'group'\?\); keys: path, instruction, group, language"),
        ({"data_files": ["a.jsonl", 3]}, r"entry 1 must be a path or a mapping with keys path, .* got int 3"),
        ({"data_files": [{"instruction": "x"}]}, r"entry 0: key 'path' is missing"),
        ({"data_files": ["  "]}, r"entry 0: key 'path' must be a non-empty path"),
        ({"data_files": [{"path": "a", "instruction": ""}]}, r"entry 0: key 'instruction' must be a non-empty text"),
        ({"data_files": [{"path": "a", "language": "cobol"}]}, r"entry 0: key 'language' must be one of"),
        ({"data_files": [{"path": "a", "group": {"col": "task"}}]}, r"entry 0: key 'group' must be a group name"),
        ({"data_files": [{"path": "a", "group": ""}]}, r"entry 0: key 'group' must be a group name"),
        ({"data_files": "a.jsonl"}, r"'data_files' must be a list of paths or \{path, instruction, group, language\}"),
        ({"data_files": []}, r"'data_files' must name at least one file or folder for data_source 'files'"),
        ({"data_source": "offline", "data_files": ["a.jsonl"]},
         r"'data_files' is read only with data_source 'files', but data_source is 'offline'"),
        ({"files_instruction": " "}, r"'files_instruction' must not be empty"),
        ({"files_heldout_fraction": 1.0}, r"'files_heldout_fraction' must be in \[0, 1\)"),
        ({"files_heldout_fraction": -0.1}, r"'files_heldout_fraction' must be in \[0, 1\)"),
    ],
)  # fmt: skip
def test_data_stage_refuses_bad_files_keys_naming_them(values, message):
    with pytest.raises(ConfigError, match=message):
        DataStage(**{"data_source": "files", "data_files": ["a.jsonl"], **values})


def test_data_stage_types_its_entries():
    entry = {"path": "b.csv", "instruction": "Find it:", "group": {"column": "task"}, "language": "SQL"}
    stage = DataStage(data_source="files", files_heldout_fraction=0, data_files=["a.jsonl", entry])
    assert stage.file_entries() == [FileEntry("a.jsonl"), FileEntry("b.csv", "Find it:", None, "task", "sql")]


def test_sources_without_heldout_rows_keep_their_rules_summary_and_fingerprint():
    """The held-out rule enters the decontamination keys, counts and summary only where rows are held out, so the
    hub and offline sources' fingerprints and metrics/data.json stay as they were."""
    keys = EvalKeys.of(["an offline text"], ({"q-key"}, {"d-key"}))
    h = hashlib.sha256(json.dumps(list(RULES)).encode())
    for part in (["q-key"], ["d-key"], [text_key("an offline text")]):
        h.update(b"\x00" + "\n".join(part).encode())
    assert keys.fingerprint() == h.hexdigest()  # the formula before the held-out rule existed
    assert EvalKeys.of(["an offline text"], ({"q-key"}, {"d-key"}), ["h-key"]).fingerprint() != h.hexdigest()
    prepared = prepare_rows(lambda checker: iter([checker.record("s", "r", "q", "p", "python", "i")]), "fp")
    assert list(prepared.decontamination()["s"]) == list(RULES)
    assert set(prepared.summary()) == {"fingerprint", "rows", "sources", "decontaminated", "unreachable"}
