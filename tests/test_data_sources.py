"""Every registry source read from its hand-made fixture; bad rows are counted and named, never silent."""

import json

import pytest

from c2llm_lib.config import SOURCE_NAMES
from c2llm_lib.data import SOURCES, TABLE_1, DataError, RowChecker, SkipReport, iter_records
from c2llm_lib.data.decontamination import MTEB_CODE_TASKS

from source_fixtures import write_fixtures


@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory):
    return write_fixtures(tmp_path_factory.mktemp("hub"))


def test_the_registry_covers_the_paper_sources():
    assert len(SOURCES) == 12 and set(SOURCES) == set(TABLE_1)
    for source in SOURCES.values():
        assert len(source.revision) == 40 and source.instruction == TABLE_1[source.name]


def test_one_list_of_the_twelve_tasks():
    # config.SOURCE_NAMES is the list, in the registry's order (the default mix); MTEB_CODE_TASKS is it in mteb's order
    assert SOURCE_NAMES == list(SOURCES)
    assert MTEB_CODE_TASKS == (
        "AppsRetrieval", "CodeEditSearchRetrieval", "CodeFeedbackMT", "CodeFeedbackST", "CodeSearchNetCCRetrieval",
        "CodeSearchNetRetrieval", "CodeTransOceanContest", "CodeTransOceanDL", "COIRCodeSearchNetRetrieval", "CosQA",
        "StackOverflowQA", "SyntheticText2SQL",
    )  # fmt: skip


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_loader_maps_its_schema(fixture_root, name):
    source = SOURCES[name]
    report = SkipReport()
    rows = list(iter_records(source, RowChecker(report), fixture_root))
    subsets = len(source.languages)
    assert len(rows) == 2 * subsets  # two good pairs per subset, the score-0 qrel is not a pair
    assert report.passed[name] == len(rows)
    for row in rows:
        assert set(row) == {"dataset", "language", "query", "positive", "negatives", "instruction"}
        assert row["dataset"] == name and row["instruction"] == TABLE_1[name] and row["negatives"] == []
        assert row["language"] in source.languages
    first = rows[0]
    if source.layout == "pairs":
        assert first["query"].startswith("fix bug") and first["positive"].startswith("- old line")
    elif source.swap:  # text -> code read from CoIR's code -> text layout
        assert first["positive"] in ("compute the area of a circle", "say hello to someone by name")
    else:
        assert first["query"] in ("compute the area of a circle", "say hello to someone by name")


def test_planted_problems_are_counted_with_row_ids(fixture_root):
    report = SkipReport()
    list(iter_records(SOURCES["CosQA"], RowChecker(report), fixture_root))
    skipped = report.as_dict()["CosQA"]
    assert skipped["passed_checks"] == 2
    assert skipped["skipped"] == {"empty text": 1, "duplicate row": 1, "qrel names a missing query or document": 1}
    assert skipped["examples"]["empty text"] == ["train:q0->d_empty"]
    assert any("CosQA: passed checks 2; skipped" in line for line in report.lines())
    assert "  empty text, e.g. train:q0->d_empty" in report.lines()


def test_the_report_reads_as_counts_then_examples():
    report = SkipReport()
    report.passed["S"] = 4
    report.skip("S", "line with invalid UTF-8", "S__hub/corpus/corpus.jsonl:2 (byte 0xff at column 9)")
    for i in range(7):  # the most frequent reason comes first; five examples at most
        report.skip("S", "empty text", f"train:q{i}->d{i}")
    report.passed["T"] = 1
    assert report.lines() == [
        "S: passed checks 4; skipped 7 empty text, 1 line with invalid UTF-8",
        "  empty text, e.g. train:q0->d0; train:q1->d1; train:q2->d2; train:q3->d3; train:q4->d4",
        "  line with invalid UTF-8, e.g. S__hub/corpus/corpus.jsonl:2 (byte 0xff at column 9)",
        "T: passed checks 1",
    ]


def test_a_missing_column_names_source_and_column(fixture_root, tmp_path):
    import shutil

    root = tmp_path / "hub"
    shutil.copytree(fixture_root, root)
    path = root / "CoIR-Retrieval__apps" / "corpus" / "corpus.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({"_id": r["_id"], "body": r["text"]}) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"source AppsRetrieval: corpus has no column \['text'\]"):
        list(iter_records(SOURCES["AppsRetrieval"], RowChecker(SkipReport()), root))


def test_an_unreachable_source_is_named(tmp_path):
    with pytest.raises(DataError, match="source AppsRetrieval: no local file"):
        list(iter_records(SOURCES["AppsRetrieval"], RowChecker(SkipReport()), tmp_path))


def test_unknown_language_and_non_utf8_are_skips():
    report = SkipReport()
    checker = RowChecker(report)
    assert checker.record("S", "r1", "q", "p", "klingon", "i") is None
    assert checker.record("S", "r2", b"\xff\xfe", "p", "python", "i") is None
    assert checker.record("S", "r3", "q\ud800", "p", "python", "i") is None
    assert checker.record("S", "r4", 5, "p", "python", "i") is None
    assert checker.record("S", "r5", "q", "p", "Python", "i")["language"] == "python"
    assert report.skipped["S"] == {"unknown language 'klingon'": 1, "non-text or non-UTF-8 text": 3}


def test_a_source_folder_linked_to_another_source_is_refused_naming_both(tmp_path):
    """A mirror whose CosQA folder is a symlink to Apps' would train Apps' rows as CosQA's (issue 23)."""
    root = write_fixtures(tmp_path / "hub")
    apps, cosqa = root / "CoIR-Retrieval__apps", root / "CoIR-Retrieval__cosqa"
    real_cosqa = tmp_path / "cosqa-download"
    cosqa.rename(real_cosqa)
    cosqa.symlink_to(apps, target_is_directory=True)
    read = lambda name: list(iter_records(SOURCES[name], RowChecker(SkipReport()), root))  # noqa: E731
    one = r"the mirror folders {}/ and {}/ \(dataset {}\) are one folder"
    with pytest.raises(DataError, match="source CosQA: " + one.format(cosqa.name, apps.name, "CoIR-Retrieval/apps")):
        read("CosQA")
    with pytest.raises(
        DataError, match="source AppsRetrieval: " + one.format(apps.name, cosqa.name, "CoIR-Retrieval/cosqa")
    ):
        read("AppsRetrieval")  # one folder under two names: which rows are whose cannot be told
    cosqa.unlink()  # a link to a folder outside the mirror (a download kept elsewhere) is this source's own
    cosqa.symlink_to(real_cosqa, target_is_directory=True)
    assert read("CosQA") and read("AppsRetrieval")
    corpus = real_cosqa / "corpus" / "corpus.jsonl"  # one file linked into another source's folder
    corpus.unlink()
    corpus.symlink_to(apps / "corpus" / "corpus.jsonl")
    with pytest.raises(
        DataError, match=r"source CosQA: .*corpus.jsonl resolves to .*, in CoIR-Retrieval__apps/ \(dataset"
    ):
        read("CosQA")
