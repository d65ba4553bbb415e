"""Preparing the mix: decontamination, fingerprints and caching, negatives per group, no silent emptiness."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from c2llm_lib.data import DataError, add_hard_negatives, prepare_rows, prepare_sources
from c2llm_lib.data.decontamination import OFFLINE_EVAL_TEXT
from c2llm_lib.files import OWNER, _maker

from source_fixtures import write_fixtures

NAMES = ["AppsRetrieval", "CosQA", "SyntheticText2SQL", "CodeSearchNetCCRetrieval"]


@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory):
    return write_fixtures(tmp_path_factory.mktemp("hub"))


def test_decontamination_removes_planted_test_items(fixture_root):
    clean = prepare_sources(NAMES, local_root=fixture_root)
    planted = ["SELECT   name FROM users\nWHERE age > 30;", "say hello to someone by name"]  # reformatted copies
    filtered = prepare_sources(NAMES, local_root=fixture_root, eval_texts=planted)
    removed = len(clean.rows) - len(filtered.rows)
    assert removed == sum(n for by_rule in filtered.decontamination().values() for n in by_rule.values()) > 0
    assert (
        filtered.decontamination()["SyntheticText2SQL"][OFFLINE_EVAL_TEXT] == 2
    )  # one by its positive, one by its query
    texts = set(filtered.rows["query"]) | set(filtered.rows["positive"])
    assert "SELECT name FROM users WHERE age > 30;" not in texts and "say hello to someone by name" not in texts


def test_two_builds_have_identical_fingerprints_and_rows(fixture_root):
    a = prepare_sources(NAMES, local_root=fixture_root)
    b = prepare_sources(NAMES, local_root=fixture_root)
    assert a.fingerprint == b.fingerprint and a.rows.to_list() == b.rows.to_list()
    assert prepare_sources(NAMES[:2], local_root=fixture_root).fingerprint != a.fingerprint


def test_the_cache_is_reused_with_its_report(fixture_root, tmp_path):
    first = prepare_sources(NAMES, local_root=fixture_root, cache_dir=tmp_path)
    assert (tmp_path / first.fingerprint / "summary.json").is_file()
    again = prepare_sources(NAMES, local_root=fixture_root, cache_dir=tmp_path)
    assert again.rows.to_list() == first.rows.to_list()
    assert again.summary() == first.summary() and again.report.as_dict()["CosQA"]["skipped"]


def test_a_build_without_a_cache_leaves_nothing_in_the_temporary_directory(fixture_root, tmp_path):
    """The Arrow files of a build without a cache stay (memory-mapped, not read into memory) while the process
    lives, and their folders go when it exits; one left by a killed build goes when the next makes its own."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    killed = subprocess.Popen([sys.executable, "-c", "pass"])  # as if a build had been killed: its folder left
    killed.wait()
    (scratch / f"c2llm-data-{killed.pid}-x").mkdir()
    (scratch / f"c2llm-data-{killed.pid}-x" / OWNER).write_text(json.dumps({**_maker(), "pid": killed.pid}))
    program = (
        "import json, os, sys; sys.path.insert(0, sys.argv[1])\n"
        "from c2llm_lib.data import add_hard_negatives, prepare_sources\n"
        f"prepared, _ = add_hard_negatives(prepare_sources({NAMES!r}, local_root=sys.argv[2]), k=1)\n"
        "assert len(prepared.rows) > 0 and prepared.rows.cache_files  # memory-mapped from a scratch folder\n"
        "print(json.dumps(sorted(os.listdir(sys.argv[3]))))\n"
    )
    env = {**os.environ, "TMPDIR": str(scratch)}
    done = subprocess.run([sys.executable, "-c", program, str(Path(__file__).parent), str(fixture_root), str(scratch)],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    during = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(during) == 2 and all(name.startswith("c2llm-data-") for name in during)  # the rows, the negatives
    assert list(scratch.iterdir()) == []


def test_unreachable_sources_error_or_are_reported(tmp_path):
    with pytest.raises(DataError, match="source AppsRetrieval"):
        prepare_sources(["AppsRetrieval"], local_root=tmp_path)
    with pytest.raises(DataError, match="unknown source"):
        prepare_sources(["NoSuchSet"])


def test_an_empty_result_is_an_error_not_an_empty_dataset():
    def nothing_valid(checker):
        for i in range(3):
            row = checker.record("Empty", f"r{i}", "", "code", "python", "instr")
            if row is not None:
                yield row

    with pytest.raises(
        DataError, match=r"(?s)no training rows.*Empty: kept 0 of 0 that passed the checks; skipped 3 empty text"
    ):
        prepare_rows(nothing_valid, "fp-empty-test")


def test_negatives_are_mined_within_each_group(fixture_root):
    prepared = prepare_sources(NAMES, local_root=fixture_root)
    mined, short = add_hard_negatives(prepared, k=1)
    assert len(mined.rows) == len(prepared.rows)
    by_group = {}
    for row in mined.rows:
        by_group.setdefault((row["dataset"], row["language"]), []).append(row)
    for rows in by_group.values():
        positives = {r["positive"] for r in rows}
        for row in rows:
            assert row["positive"] not in row["negatives"]
            assert set(row["negatives"]) <= positives  # from its own (dataset, language) group
    assert short == {}  # every fixture group has 2 rows: one negative each
    _, short7 = add_hard_negatives(prepared, k=7)
    assert sum(short7.values()) == len(prepared.rows)
