"""How `make test` shares the suite between its workers (tests/conftest.py): a file whole on one worker, the
rehearsals one by one, notebook 07's two tests together on the smoke run they share."""

from pathlib import Path

from conftest import SAME_WORKER, SPREAD, worker_scope

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
