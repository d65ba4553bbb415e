"""The offline real-code dataset: recipes on known snippets, the by-file split, the shipped snapshot."""

import ast
import json

from c2llm_lib.data.offline import CODE_TO_CODE, SNAPSHOT, SNAPSHOT_DIR, TEXT_TO_CODE, humaneval_records, load_snapshot
from c2llm_lib.data.records import text_key
from tools.build_snapshot import build_snapshot, javascript_functions, python_functions

PY = '''
def mean(values):
    """Return the arithmetic mean of values.

    Raises ValueError on an empty sequence.
    """
    if not values:
        raise ValueError("empty")
    total = sum(values)
    count = len(values)
    result = total / count
    return result
'''
JS = """
/**
 * Creates an array of unique values, in order.
 *
 * @param {Array} array The array to inspect.
 * @returns {Array} Returns the new array.
 */
function uniq(array) {
  var seen = {}, out = [];
  for (var i = 0; i < array.length; i++) {
    if (!seen[array[i]]) { seen[array[i]] = true; out.push(array[i]); }
  }
  return out;
}
"""


def fake_sources(tmp_path):
    stdlib, lodash = tmp_path / "lib", tmp_path / "lodash"
    (stdlib / "stats").mkdir(parents=True)
    (stdlib / "stats" / "core.py").write_text(PY)
    (stdlib / "test").mkdir()
    (stdlib / "test" / "test_x.py").write_text(PY)  # tests are skipped
    lodash.mkdir()
    (lodash / "uniq.js").write_text(JS)
    return stdlib, lodash


def test_python_recipes_known_answer(tmp_path):
    stdlib, _ = fake_sources(tmp_path)
    rows = {r["dataset"]: r for r in python_functions(stdlib)}
    assert set(rows) == {TEXT_TO_CODE, CODE_TO_CODE}
    csn = rows[TEXT_TO_CODE]
    assert csn["query"] == "Return the arithmetic mean of values."
    assert csn["positive"].startswith("def mean(values):\n    if not values:") and '"""' not in csn["positive"]
    ast.parse(csn["positive"])
    ccr = rows[CODE_TO_CODE]
    assert ccr["query"] + "\n" + ccr["positive"] == csn["positive"]
    assert csn["file"] == "python/stats/core.py" and csn["language"] == "python"


def test_javascript_recipe_known_answer(tmp_path):
    _, lodash = fake_sources(tmp_path)
    rows = {r["dataset"]: r for r in javascript_functions(lodash)}
    assert rows[TEXT_TO_CODE]["query"] == "Creates an array of unique values, in order."
    assert rows[TEXT_TO_CODE]["positive"].startswith("function uniq(array) {") and rows[TEXT_TO_CODE][
        "positive"
    ].endswith("}")
    assert rows[TEXT_TO_CODE]["language"] == "javascript"


def test_rebuilds_are_byte_identical(tmp_path):
    stdlib, lodash = fake_sources(tmp_path)
    a = build_snapshot(stdlib, lodash, tmp_path / "a")
    b = build_snapshot(stdlib, lodash, tmp_path / "b")
    assert a == b and (tmp_path / "a" / SNAPSHOT.name).read_bytes() == (tmp_path / "b" / SNAPSHOT.name).read_bytes()


def test_the_shipped_snapshot_is_split_by_file_without_leaks():
    rows = load_snapshot()
    manifest = json.loads((SNAPSHOT_DIR / "manifest.json").read_text())
    assert len(rows) == manifest["rows"]
    assert SNAPSHOT.stat().st_size < 8 * 2**20  # a few MB at most
    languages = {r["language"] for r in rows}
    assert {"python", "javascript"} <= languages
    for split in ("train", "test"):
        for language in languages:
            for dataset in (TEXT_TO_CODE, CODE_TO_CODE):
                assert any(r["split"] == split and r["language"] == language and r["dataset"] == dataset for r in rows)
    files = {split: {r["file"] for r in rows if r["split"] == split} for split in ("train", "test")}
    assert not files["train"] & files["test"]
    texts = {split: {text_key(r["positive"]) for r in rows if r["split"] == split} for split in ("train", "test")}
    assert not texts["train"] & texts["test"]


def test_humaneval_is_an_evaluation_set():
    rows = humaneval_records()
    assert len(rows) == 164 and all(r["split"] == "test" and r["query"] for r in rows)
    for row in rows:
        tree = ast.parse(row["positive"])
        func = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == row["function"]][0]
        assert ast.get_docstring(func) is None
