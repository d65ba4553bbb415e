"""How `make test` shares the suite between its workers (tests/conftest.py): a file whole on one worker, the
rehearsals one by one, notebook 07's two tests together on the smoke run they share; and the room on disk it checks
before the first test."""

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

import conftest
from conftest import SAME_WORKER, SPREAD, disk_shortfall, worker_scope

TESTS = Path(__file__).resolve().parent


def test_a_file_runs_whole_on_one_worker():
    assert worker_scope("tests/test_launch.py::test_a") == worker_scope("tests/test_launch.py::test_b[2-x::y]")
    assert worker_scope("tests/test_launch.py::test_a") != worker_scope("tests/test_pipeline.py::test_a")


def test_the_rehearsals_spread_and_notebook_07s_tests_share_a_worker():
    one, two = "tests/test_rehearsal.py::test_rehearsal[default]", "tests/test_rehearsal.py::test_rehearsal[own-code]"
    assert worker_scope(one) != worker_scope(two)
    assert worker_scope("tests/test_browser.py::test_lab") == worker_scope("tests/test_search.py::test_notebook_07")


def test_the_schedule_names_only_files_that_exist():
    names = {p.stem for p in TESTS.glob("test_*.py")}
    assert SPREAD | set(SAME_WORKER) | set(SAME_WORKER.values()) <= names
    users = {
        p.stem for p in TESTS.glob("test_*.py") if "smoke_merged" in p.read_text() and p.stem != "test_suite_schedule"
    }
    assert {worker_scope(f"tests/{stem}.py::t") for stem in users} == {"test_search"}  # the session's smoke run, once


def test_a_filesystem_without_room_for_the_suite_is_named_with_both_figures(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    assert disk_shortfall(tmp_path, 0) == ""
    folder = tmp_path / "not" / "made"  # asked of the nearest folder that exists
    why = disk_shortfall(folder, free + (8 << 30))
    assert str(folder) in why and f"{(free + (8 << 30)) / 2**30:.1f} GiB" in why and "GiB free" in why
    assert not folder.exists()


def session(source, basetemp, worker=False, **options):
    config = SimpleNamespace(args_source=source, option=SimpleNamespace(basetemp=str(basetemp), **options))
    if worker:
        config.workerinput = {}
    return SimpleNamespace(config=config)


def test_the_whole_suite_stops_before_its_first_test_when_the_disk_is_short(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "SUITE_DISK_GIB", shutil.disk_usage(tmp_path).free / 2**30 + 8)
    whole = pytest.Config.ArgsSource.TESTPATHS
    with pytest.raises(pytest.exit.Exception, match="free space there") as stopped:
        conftest.pytest_sessionstart(session(whole, tmp_path, keyword="", collectonly=False))
    assert stopped.value.returncode == pytest.ExitCode.USAGE_ERROR
    assert conftest.pytest_sessionstart(session(whole, tmp_path, worker=True)) is None  # its controller checked
    assert conftest.pytest_sessionstart(session(pytest.Config.ArgsSource.ARGS, tmp_path)) is None  # a part of it
    assert conftest.pytest_sessionstart(session(whole, tmp_path, keyword="merge")) is None  # -k: a part of it
    assert conftest.pytest_sessionstart(session(whole, tmp_path, collectonly=True)) is None  # runs no test
    monkeypatch.setattr(conftest, "SUITE_DISK_GIB", 0.0)
    assert conftest.pytest_sessionstart(session(whole, tmp_path)) is None
