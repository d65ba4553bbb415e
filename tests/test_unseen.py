"""The unseen-library evaluation (`data/unseen.py`, `eval.tasks.unseen_tasks`, notebooks 01 and 04's `unseen_packages`):
known answers of the miner on a tiny crafted wheel, the pin refusing a tampered file, decontamination by text and by
source, every bad package named, and notebook 04's table on a tiny run. Nothing here reaches the index: the wheels
are written in the test and laid in the cache (`C2LLM_CACHE`) where `downloads.pip_wheel` looks first."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from c2llm_lib import downloads
from c2llm_lib.checks import ConfigError
from c2llm_lib.config import DataStage, EvalStage
from c2llm_lib.data.build import build_training_data
from c2llm_lib.data.decontamination import RULES, UNSEEN_TEXT
from c2llm_lib.data.offline import CODE_TO_CODE, TEXT_TO_CODE
from c2llm_lib.data.records import DataError
from c2llm_lib.data.sources import TABLE_1
from c2llm_lib.data.unseen import mine_packages, mine_wheel
from c2llm_lib.eval.tasks import contamination_note, unseen_task_names, unseen_tasks
from c2llm_lib.pins import PINNED, package_pins
from c2llm_lib.prompts import recipe_task

ADD_ALL = '''def add_all(values):
    """Add every number of a list and return the total.

    None values are skipped.
    """
    total = 0
    for value in values:
        if value is None:
            continue
        total += value
    return total
'''
SHOUT = '''def shout(text):
    """Return the text in upper case with an exclamation mark."""
    return text.upper() + "!"
'''
SCALE = """def scale(points, factor):
    scaled = []
    for x, y in points:
        scaled.append((x * factor, y * factor))
    if not scaled:
        raise ValueError("no points")
    return scaled
"""
SHORT = 'def short(x):\n    """Too short."""\n    return x\n'  # a docstring of 2 words: no query
TEST_FILE = (
    'def test_add():\n    """Check that add_all adds every number it is given."""\n    assert add_all([1, 2]) == 3\n'
)
# the functions as the text -> code recipe keeps them: without their docstrings
ADD_ALL_CODE = ("def add_all(values):\n    total = 0\n    for value in values:\n        if value is None:\n"
                "            continue\n        total += value\n    return total")  # fmt: skip
SHOUT_CODE = 'def shout(text):\n    return text.upper() + "!"'
TINYLIB = {  # a package with documented and undocumented functions, and a test file that mining skips
    "tinylib/__init__.py": "from .core import add_all, shout\n",
    "tinylib/core.py": "\n\n".join([ADD_ALL, SHOUT, SCALE, SHORT, "def twice(x):\n    return 2 * x\n"]),
    "tinylib/tests/test_core.py": TEST_FILE,
}


def write_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A wheel `<name>-<version>-py3-none-any.whl` in `folder` holding `files` and its metadata, byte for byte the
    same on every call (stored, fixed times, sorted)."""
    folder.mkdir(parents=True, exist_ok=True)
    meta = f"{name}-{version}.dist-info"
    members = {**files, f"{meta}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
               f"{meta}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}  # fmt: skip
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for member, text in sorted(members.items()):
            archive.writestr(zipfile.ZipInfo(member, (1980, 1, 1, 0, 0, 0)), text)
    return path


def pin_of(name: str, version: str, wheel: Path) -> str:
    return f"{name} {version} sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}"


def tinylib_in_cache(tmp_path: Path, monkeypatch) -> list[str]:
    """`unseen_packages` for a run here: tinylib's wheel in a cache of the test's own (`C2LLM_CACHE`), pinned as PyPI's
    wheels are, so that nothing reaches the index."""
    monkeypatch.setenv("C2LLM_CACHE", str(tmp_path / "cache"))
    return [pin_of("tinylib", "1.0", write_wheel(tmp_path / "cache" / "wheels", "tinylib", "1.0", TINYLIB))]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache folder (`C2LLM_CACHE`) holding tinylib's wheel, as a first fetch would leave it."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("C2LLM_CACHE", str(folder))
    write_wheel(folder / "wheels", "tinylib", "1.0", TINYLIB)
    return folder


@pytest.fixture
def tinylib(cache) -> str:
    return pin_of("tinylib", "1.0", cache / "wheels" / "tinylib-1.0-py3-none-any.whl")


def test_the_miner_knows_the_answers_on_a_tiny_package(tinylib, cache):
    """Every function of the package is mined (the test file is skipped); a docstring's first paragraph of 3+ words
    asks for its function (text -> code), a function of 6+ lines splits in half (code -> code), and every function is
    a document of the text -> code corpus, documented or not."""
    (mined,) = mine_packages([tinylib])
    assert mined.pin.name == "tinylib" and mined.modules == ("tinylib",)
    assert (mined.functions, mined.documented) == (5, 3)  # add_all, shout, scale, short, twice; 3 with a docstring
    assert mined.report.skipped["code root tinylib-1.0"] == {"test folder or file": 1}
    text = [(r["query"], r["positive"], r["function"]) for r in mined.rows[TEXT_TO_CODE]]
    assert text == [("Add every number of a list and return the total.", ADD_ALL_CODE, "add_all"),
                    ("Return the text in upper case with an exclamation mark.", SHOUT_CODE, "shout")]  # fmt: skip
    short, twice = "def short(x):\n    return x", "def twice(x):\n    return 2 * x"
    assert mined.corpus[TEXT_TO_CODE] == [ADD_ALL_CODE, SHOUT_CODE, SCALE.rstrip(), short, twice]
    halves = [(r["query"], r["positive"]) for r in mined.rows[CODE_TO_CODE]]
    assert halves == [("def add_all(values):\n    total = 0\n    for value in values:",
                       "        if value is None:\n            continue\n        total += value\n    return total"),
                      ("def scale(points, factor):\n    scaled = []\n    for x, y in points:",
                       "        scaled.append((x * factor, y * factor))\n    if not scaled:\n"
                       '        raise ValueError("no points")\n    return scaled')]  # fmt: skip
    assert mined.corpus[CODE_TO_CODE] == [positive for _, positive in halves]
    assert {r["file"] for r in mined.rows[TEXT_TO_CODE]} == {"tinylib-1.0/tinylib/core.py"}
    assert mine_wheel(mined.pin, cache / "wheels" / "tinylib-1.0-py3-none-any.whl").rows == mined.rows  # same bytes


def test_each_package_is_two_tasks_over_its_whole_corpus(tinylib, cache):
    """`unseen-text2code-<package>` ranks each docstring against every function of the package (the answers of no
    query too); `unseen-code2code-<package>` each first half against every function's rest; the prompts are the
    recipes'."""
    t2c, c2c = unseen_tasks([tinylib])
    assert (t2c.name, c2c.name) == ("unseen-text2code-tinylib", "unseen-code2code-tinylib")
    assert len(t2c.queries) == 2 and len(t2c.corpus) == 5 and len(c2c.queries) == 2 and len(c2c.corpus) == 2
    for task in (t2c, c2c):
        assert all(len(judged) == 1 for judged in task.qrels.values())
    answer = {t2c.queries[q]: t2c.corpus[next(iter(d))] for q, d in t2c.qrels.items()}
    assert answer["Add every number of a list and return the total."] == ADD_ALL_CODE
    assert SCALE.rstrip() in t2c.corpus.values()  # undocumented: a distractor, relevant to no query
    assert (recipe_task(t2c.name), recipe_task(c2c.name)) == (TEXT_TO_CODE, CODE_TO_CODE)
    assert (t2c.instruction, c2c.instruction) == (TABLE_1[TEXT_TO_CODE], TABLE_1[CODE_TO_CODE])
    assert unseen_task_names([tinylib]) == {t2c.name: tinylib, c2c.name: tinylib}
    (limited, _) = unseen_tasks([tinylib], limit=1)
    assert len(limited.queries) == 1 and len(limited.corpus) == 5 and limited.split_queries == 2
    assert unseen_tasks([]) == []


def test_a_tampered_wheel_is_refused(tinylib, cache):
    """The cached wheel is read only when its sha256 is the pinned one: a changed byte is refused, naming the file,
    both digests and how to fetch it again."""
    wheel = cache / "wheels" / "tinylib-1.0-py3-none-any.whl"
    data = bytearray(wheel.read_bytes())
    data[data.index(b"total = 0")] = ord("T")  # one byte of the source
    wheel.write_bytes(bytes(data))
    found = hashlib.sha256(bytes(data)).hexdigest()
    pinned = tinylib.split(":")[1]
    message = rf"tinylib 1\.0 .*{wheel.name} has sha256 {found}, but sha256 {pinned} is pinned.*refusing it \(delete"
    with pytest.raises(downloads.FetchError, match=message):
        mine_packages([tinylib])
    with pytest.raises(downloads.FetchError, match="refusing"):  # notebook 04 reads the same wheel the same way
        unseen_tasks([tinylib])


def test_a_package_the_index_does_not_have_is_named(cache, monkeypatch):
    class Failed:
        returncode, stdout, stderr = 1, "", "ERROR: No matching distribution found for nosuchlib==1.0"

    monkeypatch.setattr(downloads.subprocess, "run", lambda *a, **k: Failed())
    message = r"could not fetch nosuchlib==1\.0 .*unseen_packages \(set it to \[\] to run without it\)\): .*No matching"
    with pytest.raises(downloads.FetchError, match=message):
        mine_packages(["nosuchlib 1.0 sha256:" + "0" * 64])
    assert not list((cache / "wheels").glob(".pip-*")), "the staging folder is removed"


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            ["nosuchlib"],
            r"entry 0 'nosuchlib': no pinned package of that name \(pinned: bidict, humanize, "
            r"sortedcontainers, tabulate, toolz\)",
        ),
        (["toolz", "Toolz"], r"entry 1 'Toolz': package 'toolz' is also entry 0"),
        (["x 1.0 md5:00"], r"entry 0 'x 1.0 md5:00': the third part must be the wheel's digest as sha256"),
        (["x 1.0"], r"entry 0 'x 1.0': expected a package name"),
        ([" "], r"entry 0 ' ': expected a package name"),
    ],
)
def test_a_bad_entry_is_a_config_error_naming_it(entries, message):
    for stage in (DataStage, EvalStage):  # notebooks 01 and 04 refuse it alike, before anything runs
        with pytest.raises(ConfigError, match=rf"parameter 'unseen_packages' {message}"):
            stage(unseen_packages=entries)


def test_the_pinned_packages_are_pinned():
    pins = package_pins(list(PINNED))
    assert [p.name for p in pins] == ["sortedcontainers", "toolz", "tabulate", "humanize", "bidict"]
    assert all(len(p.sha256) == 64 for p in pins) and str(pins[1]).startswith("toolz 1.2.0 sha256:890f820b")
    assert package_pins(["TOOLZ"]) == [pins[1]]  # names compare as the index compares them


def test_an_empty_package_is_named(cache):
    """A package with no Python file, or no function to ask for, is an error naming it and why."""
    wheels = cache / "wheels"
    empty = pin_of("emptylib", "2.0", write_wheel(wheels, "emptylib", "2.0", {"emptylib/__init__.py": "X = 1\n"}))
    with pytest.raises(DataError, match=r"unseen package emptylib 2\.0 sha256:[0-9a-f]{64}: no CodeSearchNetRetrieval "
                                        r"and no CodeSearchNetCCRetrieval query among its 0 functions"):  # fmt: skip
        mine_packages([empty])
    data = pin_of("datalib", "1.0", write_wheel(wheels, "datalib", "1.0", {"datalib/table.csv": "a,b\n"}))
    with pytest.raises(DataError, match=r"unseen package datalib 1\.0 .*holds no Python file"):
        mine_packages([data])
    terse = {"tersel/core.py": "def f(x):\n    return x\n"}  # a function, but no docstring and under 6 lines
    with pytest.raises(DataError, match=r"tersel 1\.0 .*no CodeSearchNetRetrieval and no CodeSearchNetCCRetrieval "
                                        r"query among its 1 functions \(0 with a docstring"):  # fmt: skip
        mine_packages([pin_of("tersel", "1.0", write_wheel(wheels, "tersel", "1.0", terse))])


def test_a_training_row_equal_to_an_unseen_text_is_dropped_and_counted(tinylib, tmp_path):
    """A training row whose query or positive is a query or a document of an unseen library's task (a distractor of
    its corpus too) does not train, counted under "unseen-library text"; notebook 01's record names the pin."""
    from test_data_files import write_jsonl

    (mined,) = mine_packages([tinylib])
    pairs = [
        {"query": "Add every number of a list and return the total.", "pos": ["def total(v):\n    return sum(v)"]},
        {"query": "multiply two numbers", "pos": ["def twice(x):\n    return 2 * x"]},  # an undocumented function
        {"query": "def scale(points, factor):\n    scaled = []\n    for x, y in points:",
         "pos": [mined.corpus[CODE_TO_CODE][1]]},  # a code -> code pair of the library
        {"query": "a query of no library", "pos": ["def kept():\n    pass"]},
    ]  # fmt: skip
    path = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    stage = DataStage(data_source="files", data_files=[str(path)], files_heldout_fraction=0.0, num_negatives=0)
    plain, _ = build_training_data(stage)
    assert len(plain.rows) == 4 and UNSEEN_TEXT not in plain.decontamination()["pairs"]  # no packages: no rule
    stage.unseen_packages = [tinylib]
    prepared, _ = build_training_data(stage)
    assert prepared.rows["query"] == ["a query of no library"]
    assert prepared.decontamination()["pairs"] == dict.fromkeys(RULES, 0) | {UNSEEN_TEXT: 3}
    assert "3 unseen-library text" in prepared.lines()[0] and prepared.summary()["unseen_packages"] == [tinylib]
    assert prepared.fingerprint != plain.fingerprint


def test_a_training_source_holding_the_package_is_refused(cache):
    """By source: a package whose module the offline snapshot's standard library holds (`json`) is not unseen by a
    run trained on it; the error names the package, the source and files."""
    wheels = cache / "wheels"
    files = {"json/tools.py": ADD_ALL}  # a package that brings its own json module
    pin = pin_of("jsonfork", "1.0", write_wheel(wheels, "jsonfork", "1.0", files))
    with pytest.raises(DataError, match=r"unseen package jsonfork 1\.0 .*: the training source the offline snapshot "
                                        r"\(CPython standard library, lodash\) holds \d+ files named like it or its "
                                        r"modules \(json\), e\.g\. python/json/"):  # fmt: skip
        build_training_data(DataStage(unseen_packages=[pin]))


def test_the_unseen_libraries_count_as_checked_only_where_notebook_01_recorded_them(tinylib):
    names = unseen_task_names([tinylib])
    evaluated = ["offline-text2code-python", *names]
    record = {"decontaminated_mteb_tasks": [], "unseen_packages": [tinylib]}
    assert contamination_note(evaluated, record, "run r", names) == ""
    other = {**record, "unseen_packages": ["tinylib 1.0 sha256:" + "0" * 64]}  # another wheel of the same name
    note = contamination_note(evaluated, other, "run r", names)
    assert "against unseen-text2code-tinylib, unseen-code2code-tinylib (" in note and "unseen_packages" in note
    assert "unseen-text2code-tinylib" in contamination_note(evaluated, None, "released x", names)


@pytest.mark.slow
def test_notebook_04_reports_the_unseen_libraries_on_a_tiny_run(tinylib, tmp_path):
    """The smoke run with an unseen library: notebook 01 records its pin, notebook 04 scores its two tasks with every
    model and BM25, in a table of its own with their sizes and the trained model's intervals, and names no unseen
    task as unchecked."""
    from c2llm_lib.pipeline import run_pipeline

    smoke = Path(__file__).resolve().parent.parent / "params" / "smoke.yaml"
    run = run_pipeline(smoke, only=["01", "02", "03", "04"], sets={"unseen_packages": [tinylib]},
                       outputs=tmp_path / "outputs", log=lambda *_: None)  # fmt: skip
    metrics = run.root / "metrics"
    data = json.loads((metrics / "data.json").read_text())
    assert data["unseen_packages"] == [tinylib] and all(UNSEEN_TEXT in r for r in data["decontaminated"].values())
    tasks = ["unseen-text2code-tinylib", "unseen-code2code-tinylib"]
    scores = json.loads((metrics / "unseen.json").read_text())
    assert set(scores) == set(json.loads((metrics / "eval.json").read_text())) and "BM25" in scores
    assert all(sorted(s) == sorted(tasks) for s in scores.values())
    sizes = json.loads((metrics / "unseen_tasks.json").read_text())
    assert {t: (s["queries"], s["documents"]) for t, s in sizes.items()} == {tasks[0]: (2, 5), tasks[1]: (2, 2)}
    intervals = json.loads((metrics / "unseen_intervals.json").read_text())
    assert {(d["a"], d["b"]) for d in intervals} == {("C2LLM recipe (merged)", m) for m in scores} - {
        ("C2LLM recipe (merged)", "C2LLM recipe (merged)")}  # fmt: skip
    assert all(set(d["intervals"]) == {*tasks, "mean"} for d in intervals)
    results = (metrics / "results.md").read_text()
    table = results[results.index("### Unseen libraries, nDCG@10 x 100") :]
    assert f"| model | {tasks[0]} | {tasks[1]} | mean |" in table and "| *documents per task* | 5 | 2 |" in table
    assert "against each other model, Unseen libraries" in table and "unseen-text2code-tinylib" not in (
        results[results.index("**Not checked") :] if "**Not checked" in results else "")  # fmt: skip
