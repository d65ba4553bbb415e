"""One function miner: the library mines with tree-sitter, and the offline snapshot was mined by the regex miners of
tools/build_snapshot.py. These tests compare the two on the snapshot's sources (`compare_miners`): they give other
rows (docs/data.md, "The offline snapshot"), so the regex miners stay in tools/ and the shipped rows stay as mined.
"""

import os
import sys
import sysconfig
from pathlib import Path

import pytest

from c2llm_lib.data.offline import CODE_TO_CODE, TEXT_TO_CODE
from tools.build_snapshot import compare_miners

SAME = '''
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
TRAILING_COMMENT = '''
def flush(self):
    """Flush the write buffers of the stream, if applicable."""
    self._check_closed()
    self._buffer.clear()
    # XXX should this return the number of bytes written?
'''
ENTITY = '''
def unescape_text(data):
    """Unescape &amp;, &lt;, and &gt; in a string of data."""
    data = data.replace("&lt;", "<")
    data = data.replace("&gt;", ">")
    return data.replace("&amp;", "&")
'''
JS_TOP = """
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
JS_BUNDLED = """
;(function() {
  /**
   * Appends the elements of `values` to `array`.
   *
   * @private
   */
  function arrayPush(array, values) {
    var index = -1, length = values.length;
    while (++index < length) {
      array.push(values[index]);
    }
    return array;
  }
}.call(this));
"""


def sources(tmp_path, python: dict[str, str], javascript: dict[str, str]) -> tuple[Path, Path]:
    stdlib, lodash = tmp_path / "lib", tmp_path / "lodash"
    for folder, files in ((stdlib, python), (lodash, javascript)):
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
    return stdlib, lodash


def test_the_miners_agree_on_plain_functions(tmp_path):
    found = compare_miners(*sources(tmp_path, {"stats.py": SAME}, {"uniq.js": JS_TOP}))
    for language in ("python", "javascript"):
        assert found[language]["rows"] == {"regex": 2, "tree_sitter": 2}
        assert found[language]["only_regex"] == found[language]["only_tree_sitter"] == []


def test_the_miners_differ_where_the_docs_say(tmp_path):
    python = {"io.py": TRAILING_COMMENT, "html.py": ENTITY}
    found = compare_miners(*sources(tmp_path, python, {"lodash.js": JS_BUNDLED}))
    py = found["python"]
    # a comment after a body's last statement: tree-sitter's block holds it, ast's last line stops before it
    [regex_flush] = [r for r in py["only_regex"] if r["function"] == "flush"]
    [tree_flush] = [r for r in py["only_tree_sitter"] if r["function"] == "flush"]
    comment = "\n    # XXX should this return the number of bytes written?"
    assert tree_flush["positive"] == regex_flush["positive"] + comment
    # HTML entities: summary_of unescapes them, the first paragraph keeps them
    [regex_entity] = [r for r in py["only_regex"] if r["function"] == "unescape_text"]
    [tree_entity] = [r for r in py["only_tree_sitter"] if r["function"] == "unescape_text"]
    assert regex_entity["query"] == "Unescape &amp;, &lt;, and &gt; in a string of data."
    assert tree_entity["query"] == "Unescape &, <, and > in a string of data."
    assert regex_entity["positive"] == tree_entity["positive"]
    # a JSDoc function indented in a bundle (lodash.js, core.js): the regex needs `function` at a line's start
    js = found["javascript"]
    assert js["rows"] == {"regex": 0, "tree_sitter": 2} and js["only_regex"] == []
    assert {r["dataset"] for r in js["only_tree_sitter"]} == {TEXT_TO_CODE, CODE_TO_CODE}
    assert js["functions"]["only_tree_sitter"] == [("javascript/lodash/lodash.js", "arrayPush")]


@pytest.mark.slow
def test_the_miners_on_the_snapshots_sources():
    """The standard library of this interpreter, and lodash when LODASH_PACKAGE_DIR names an unpacked lodash package
    (`npm pack lodash@4.17.21`); on CPython 3.11.7 and lodash 4.17.21, the snapshot's sources, the counts are those
    docs/data.md gives."""
    lodash = os.environ.get("LODASH_PACKAGE_DIR")
    found = compare_miners(Path(sysconfig.get_paths()["stdlib"]), Path(lodash) if lodash else None)
    for language, side in found.items():
        print(language, side["rows"], {k: len(side[k]) for k in ("only_regex", "only_tree_sitter")},
              {k: len(v) for k, v in side["functions"].items()})  # fmt: skip
    py = found["python"]
    assert py["only_regex"] or py["only_tree_sitter"]  # not the same rows: the regex miners stay in tools/
    assert len(py["only_regex"]) + len(py["only_tree_sitter"]) < 0.01 * py["rows"]["regex"]  # nearly the same
    if sys.version.split()[0] == "3.11.7":
        assert py["rows"] == {"regex": 8144, "tree_sitter": 8143}
        assert (len(py["only_regex"]), len(py["only_tree_sitter"])) == (26, 25)
        assert (len(py["functions"]["only_regex"]), len(py["functions"]["only_tree_sitter"])) == (1, 0)
    if lodash and "4.17.21" in (Path(lodash) / "package.json").read_text():
        js = found["javascript"]
        assert js["rows"] == {"regex": 722, "tree_sitter": 1610}
        assert (len(js["only_regex"]), len(js["only_tree_sitter"])) == (1, 889)
        assert len(js["functions"]["only_tree_sitter"]) == 586 and not js["functions"]["only_regex"]
        bundles = {file for file, _ in js["functions"]["only_tree_sitter"]}
        assert {"javascript/lodash/lodash.js", "javascript/lodash/core.js"} <= bundles
