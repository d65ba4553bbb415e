"""Pairs mined from local source trees (`data_source: code`, data/code_trees.py, tree_walk.py and grammars.py).

Known answers on the hand-written multi-language tree in tests/fixtures/own-code/ (which function becomes which
pair, the query after comment cleaning, the lines), the split by file, every skip rule with its count and
examples, files that do not parse, bad roots, determinism, and that mining never changes the user's files."""

import hashlib
import importlib.util
import json
import os
import socket
from collections import Counter
from pathlib import Path

import pytest

from c2llm_lib.checks import ConfigError
from c2llm_lib.config import DataStage
from c2llm_lib.data import code_trees, tree_walk
from c2llm_lib.data.build import build_training_data
from c2llm_lib.data.code_trees import MiningReport, every_function, mine, prepare_code
from c2llm_lib.data.decontamination import HELDOUT_TEXT, OFFLINE_EVAL_TEXT
from c2llm_lib.data.grammars import summary_of
from c2llm_lib.data.offline import split_of
from c2llm_lib.data.records import DataError, SkipReport, normalize_text, text_key
from c2llm_lib.data.sources import TABLE_1
from c2llm_lib.data.tree_walk import code_roots, source_files

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "own-code"
ROOT = "code root own-code"
T2C, C2C = "CodeSearchNetRetrieval", "CodeSearchNetCCRetrieval"


@pytest.fixture(scope="module")
def mined():
    report = MiningReport()
    return list(mine([FIXTURE], report=report)), report


def by_function(rows, file, function, dataset=T2C):
    key = (f"own-code/{file}", function, dataset)
    found = [r for r in rows if (r["file"], r["function"], r["dataset"]) == key]
    assert len(found) == 1, (file, function, dataset, len(found))
    return found[0]


# (file, function, language, start_line, end_line, query): read off the fixture files by hand
KNOWN = [
    ("python/textkit/normalize.py", "collapse_whitespace", "python", 10, 17,
     "Collapse every run of whitespace in a text to a single space."),
    ("python/textkit/cache.py", "edit_distance", "python", 56, 65,  # from its decorator
     "Compute the Levenshtein distance between two strings with a memoised recursion."),
    ("python/textkit/cache.py", "get", "python", 16, 23,  # a method
     "Return the value stored under key and mark it as most recently used."),
    ("javascript/strings.js", "camelCase", "javascript", 12, 20,  # @param, @returns and @example cut
     "Converts a string to camel case, removing separators and capitalising every word after the first."),
    ("javascript/strings.js", "kebabCase", "javascript", 26, 33,  # a tag on the next line, no blank line
     "Converts a string to kebab case: lower case words joined by hyphens."),
    ("javascript/strings.js", "escapeHtml", "javascript", 39, 46,  # {@link x} -> x
     "Escapes the characters `&`, `<`, `>`, `\"` and `'` so that a string can be inserted into HTML. "
     "See unescapeHtml for the reverse."),
    ("javascript/strings.js", "truncate", "javascript", 60, 67,  # const truncate = (...) => {...}
     "Truncates a string to a maximum length, ending it with an omission marker."),
    ("javascript/emitter.js", "emit", "javascript", 50, 56,  # a class method
     "Calls every listener of an event with the given arguments, in the order they were registered, and returns "
     "how many were called."),
    ("javascript/keep.local.js", "localSettings", "javascript", 6, 13,  # re-included by the nested .gitignore
     "Reads the local development settings from the environment, with defaults."),
    ("typescript/money.ts", "parseMoney", "typescript", 23, 30,  # export const ... =>, @throws cut
     "Parses a string such as \"12.30 USD\" into an amount and a currency code."),
    ("typescript/retry.ts", "url", "typescript", 12, 20,  # from its decorator
     "Builds an absolute URL from a path and query parameters, encoding each value."),
    ("typescript/Badge.tsx", "Badge", "typescript", 6, 13,
     "Renders a small coloured badge with a label and an optional count."),
    ("go/mathutil.go", "Clamp", "go", 10, 21,  # two // lines
     "Clamp limits a value to the closed interval [lo, hi]. It panics when lo is greater than hi."),
    ("go/mathutil.go", "Mean", "go", 59, 68,  # the //go:noinline directive dropped
     "Mean returns the arithmetic mean of a slice of numbers."),
    ("go/stack.go", "Peek", "go", 28, 35,  # a /* */ block
     "Peek returns the value on top of the stack without removing it."),
    ("java/src/main/java/com/example/text/TextUtils.java", "repeat", "java", 31, 43,  # {@code x}, then <p>
     "Repeats a string times times, separated by a delimiter."),
    ("java/src/main/java/com/example/text/Matrix.java", "Matrix", "java", 10, 18,  # a constructor
     "Creates a matrix of the given size filled with zeros."),
    ("ruby/slug.rb", "from", "ruby", 7, 13,  # first method of a class body, # @param cut
     "Turns a title into a lowercase slug of words joined by hyphens."),
    ("php/helpers.php", "limit", "php", 26, 33,
     "Limits the number of characters in a string, appending an ending."),
    ("c/ring_buffer.c", "ring_read", "c", 25, 34,
     "Reads up to len bytes from the ring buffer into dst. Returns the number of bytes read."),
    ("cpp/stats.hpp", "variance", "c++", 9, 18,  # /// lines above a template
     "Computes the sample variance of a vector of numbers. Returns 0 for fewer than two values."),
    ("csharp/Temperature.cs", "CelsiusToFahrenheit", "c#", 12, 19,  # <summary> only
     "Converts a temperature from degrees Celsius to degrees Fahrenheit."),
    ("rust/src/lib.rs", "is_prime", "rust", 19, 33,  # from its attributes
     "Tells whether a number is prime by trial division."),
    ("rust/src/lib.rs", "factorial", "rust", 10, 16,  # the # Examples section cut
     "Returns the factorial of `n`, or `None` when it overflows a `u64`."),
]  # fmt: skip


@pytest.mark.parametrize(("file", "function", "language", "start", "end", "query"), KNOWN)
def test_known_text_to_code_pairs(mined, file, function, language, start, end, query):
    rows, _ = mined
    row = by_function(rows, file, function)
    assert row["query"] == query
    assert (row["language"], row["start_line"], row["end_line"]) == (language, start, end)
    lines = (FIXTURE / file).read_text().splitlines()[start - 1 : end]
    assert lines[0].strip().startswith(row["positive"].splitlines()[0].strip())  # the code starts on start_line
    assert row["positive"].splitlines()[-1].strip() == lines[-1].strip()  # and ends on end_line
    assert row["instruction"] == TABLE_1[T2C] and row["negatives"] == []
    assert row["split"] == split_of(file)  # by the path inside the root


def test_the_document_is_the_function_without_its_docstring_dedented(mined):
    rows, _ = mined
    assert by_function(rows, "python/textkit/normalize.py", "collapse_whitespace")["positive"] == (
        'def collapse_whitespace(text):\n    if not text:\n        return ""\n    return _SPACES.sub(" ", text).strip()'
    )
    method = by_function(rows, "python/textkit/cache.py", "put")["positive"]
    assert method.startswith("def put(self, key, value):\n    if key in self._items:") and '"""' not in method
    arrow = by_function(rows, "javascript/strings.js", "truncate")["positive"]
    assert arrow.startswith("const truncate = (text, length = 30, omission = '...') => {") and arrow.endswith("};")
    assert by_function(rows, "typescript/retry.ts", "url")["positive"].startswith("@decorate\nurl(path: string")
    assert by_function(rows, "cpp/stats.hpp", "variance")["positive"].startswith("template <typename T>\ndouble")
    for row in rows:  # no documentation comment is part of a document
        assert not row["positive"].lstrip().startswith(("/**", "///", "# ", "// ")), (row["file"], row["function"])


def test_code_to_code_pairs_are_the_two_halves_of_the_same_function(mined):
    rows, _ = mined
    text_pairs = {(r["file"], r["function"], r["start_line"]): r for r in rows if r["dataset"] == T2C}
    halves = [r for r in rows if r["dataset"] == C2C]
    assert len(halves) >= 60
    for row in halves:
        whole = row["query"] + "\n" + row["positive"]
        assert len(row["query"].splitlines()) == len(whole.splitlines()) // 2
        assert row["instruction"] == TABLE_1[C2C]
        twin = text_pairs.get((row["file"], row["function"], row["start_line"]))
        if twin is not None:
            assert twin["positive"] == whole


def test_undocumented_functions_and_non_doc_comments_give_no_pair(mined):
    rows, report = mined
    functions = {r["function"] for r in rows}
    undocumented = {"count_word_chars", "_is_word_char", "longest_sentence", "wrapper", "capitalize", "last",
                    "siftDown", "countVowels", "abs", "ring_clear", "valid?", "square", "decorate"}  # fmt: skip
    assert not functions & undocumented
    assert report.documented["javascript"] < report.functions["javascript"]  # capitalize's // comment, last
    assert report.documented["rust"] == 2 and report.functions["rust"] == 3  # //// is not documentation


def test_every_function_documented_or_not_through_the_same_walk(mined):
    """The documents of a search (search/): every named function, with mining's lines and code for the documented
    ones, found by the same walk and skip rules."""
    rows, mining = mined
    report = SkipReport()
    found = {(s.file, f.name, f.start_line): f for s in source_files(code_roots([FIXTURE]), report)
             for f in every_function(s, report) or []}  # fmt: skip
    undocumented = {"count_word_chars", "_is_word_char", "longest_sentence", "wrapper", "capitalize", "last",
                    "siftDown", "countVowels", "abs", "ring_clear", "valid?", "square", "decorate"}  # fmt: skip
    assert undocumented <= {name for _, name, _ in found}
    for row in rows:
        if row["dataset"] == T2C:
            function = found[row["file"], row["function"], row["start_line"]]
            assert (function.code, function.end_line) == (row["positive"], row["end_line"]) and function.doc
    count = next(f for (file, name, _), f in found.items() if name == "count_word_chars")
    assert count.doc == "" and count.code.startswith("def count_word_chars(")
    assert report.passed == mining.files.passed and report.skipped == mining.files.skipped  # the same rules


def test_source_files_selects_files_and_names_a_root_left_empty(tmp_path):
    root = write(tmp_path / "proj", {"a.py": DOCUMENTED, "b.py": CLAMP, "notes.txt": "x"})
    report = SkipReport()
    kept = [s.file for s in source_files(code_roots([root]), report, keep=lambda f: f.endswith("/b.py"))]
    assert kept == ["proj/b.py"] and report.skipped["code root proj"].total() == 0  # unselected: not counted
    other = write(tmp_path / "other", {"c.py": DOCUMENTED})
    both = [s.file for s in source_files(code_roots([root, other]), SkipReport(), keep=lambda f: f.startswith("o"))]
    assert both == ["other/c.py"]  # a root the selection leaves empty is no error while another has files
    with pytest.raises(DataError, match=r"code roots 'proj' \(.*\): no source file among the files selected"):
        list(source_files(code_roots([root]), SkipReport(), keep=lambda f: False))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=r"code root 'empty' \(.*\) has no source file \(extensions .*skipped: nothing"):
        list(source_files(code_roots([empty]), SkipReport()))


def test_every_skip_rule_is_counted_with_examples(mined):
    _, report = mined
    assert report.files.skipped[ROOT] == Counter({
        tree_walk.TEST: 6, tree_walk.FOLDER: 3, tree_walk.GITIGNORED: 3, tree_walk.GENERATED: 2,
        tree_walk.MINIFIED: 2, code_trees.NOT_PARSED: 2, tree_walk.HIDDEN: 1, tree_walk.UNSUPPORTED: 1,
        tree_walk.EMPTY: 1, tree_walk.NOT_UTF8: 1,
    })  # fmt: skip
    examples = {reason: report.files.examples[ROOT, reason] for reason in report.files.skipped[ROOT]}
    assert examples[tree_walk.FOLDER] == ["own-code/go/vendor/", "own-code/javascript/dist/",
                                           "own-code/javascript/node_modules/"]  # fmt: skip
    assert examples[tree_walk.GITIGNORED] == [
        "own-code/javascript/experiments/", "own-code/javascript/settings.local.js", "own-code/scratch/"]  # fmt: skip
    assert examples[tree_walk.GENERATED] == ["own-code/go/zz_generated_color.go",
                                              "own-code/python/textkit/messages_pb2.py"]  # fmt: skip
    assert examples[tree_walk.MINIFIED] == ["own-code/javascript/app.min.js", "own-code/javascript/widgets.bundle.js"]
    assert examples[tree_walk.HIDDEN] == ["own-code/.github/"]
    assert examples[tree_walk.EMPTY] == ["own-code/python/textkit/__init__.py"]
    assert examples[tree_walk.NOT_UTF8] == ["own-code/python/textkit/legacy_latin1.py"]
    assert examples[tree_walk.UNSUPPORTED] == ["own-code/README.md"]
    # the sixth test file, typescript/queue.spec.ts, comes after the five examples kept
    assert examples[tree_walk.TEST] == [
        "own-code/go/mathutil_test.go", "own-code/java/src/test/", "own-code/javascript/strings.test.js",
        "own-code/python/tests/", "own-code/python/textkit/test_stats.py",
    ]  # fmt: skip
    assert report.files.passed[ROOT] == 29


def test_a_file_that_does_not_parse_is_named_with_its_first_error_line_and_skipped(mined):
    rows, report = mined
    assert report.files.examples[ROOT, code_trees.NOT_PARSED] == [
        "own-code/javascript/broken.js:16",  # the brace never closed: the error is at the end
        "own-code/python/textkit/draft.py:7",  # `text.split(:`
    ]
    assert not {"isoDate", "addDays", "wrap_paragraph"} & {r["function"] for r in rows}


def test_the_split_is_by_file_stable_and_follows_test_percent(mined):
    rows, _ = mined
    sides: dict[str, set[str]] = {}
    for row in rows:
        sides.setdefault(row["file"], set()).add(row["split"])
    assert all(len(s) == 1 for s in sides.values())  # no file on both sides
    test_files = sorted(f for f, s in sides.items() if s == {"test"})
    assert test_files == ["own-code/go/mathutil.go", "own-code/go/stack.go", "own-code/javascript/arrays.js",
                          "own-code/javascript/emitter.js", "own-code/python/textkit/intervals.py",
                          "own-code/python/textkit/markup.py"]  # fmt: skip
    assert list(mine([FIXTURE])) == rows  # the same records in the same order on every run
    assert {r["split"] for r in mine([FIXTURE], test_percent=0)} == {"train"}
    assert {r["split"] for r in mine([FIXTURE], test_percent=100)} == {"test"}
    half = {r["file"] for r in mine([FIXTURE], test_percent=50) if r["split"] == "test"}
    assert set(test_files) < half  # a larger share keeps every file that was held out


def test_enough_train_pairs_for_a_tiny_training_run(mined):
    _, report = mined
    for group in ("python", "javascript"):
        assert report.pairs[f"train/{T2C}/{group}"] >= 12 and report.pairs[f"train/{C2C}/{group}"] >= 12


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """{path: (sha256, mtime_ns)} of every file and folder under root, links not followed."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            info = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else ""
            out[str(path.relative_to(root))] = (digest, info.st_mtime_ns)
    return out


def test_mining_never_changes_the_users_tree(tmp_path):
    before = _snapshot(FIXTURE)
    assert len(before) > 50
    list(mine([FIXTURE]))
    stage = DataStage(data_source="code", code_roots=[str(FIXTURE)], num_negatives=1)
    build_training_data(stage)
    assert _snapshot(FIXTURE) == before  # byte-identical, no new file (no __pycache__, no cache)


def test_mining_streams_file_by_file(monkeypatch):
    reads = []
    real = tree_walk._read
    monkeypatch.setattr(tree_walk, "_read", lambda path, limit: reads.append(path) or real(path, limit))
    records = mine([FIXTURE])
    assert reads == []  # nothing is read before the first record is asked for
    next(records)
    assert len(reads) <= 3  # the C file is the first with a documented function


def write(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root


def documented(name: str = "mean", what: str = "numbers") -> str:
    """A documented Python function of 7 lines (a text->code and a code->code pair)."""
    return f'''def {name}(values):
    """Arithmetic mean of a list of {what}, zero for an empty list."""
    if not values:
        return 0.0
    total = 0.0
    for value in values:
        total += value
    return total / len(values)
'''


DOCUMENTED = documented()
CLAMP = '''def clamp(value, low, high):
    """Limit a value to the closed interval from low to high."""
    if low > high:
        raise ValueError("low > high")
    if value < low:
        return low
    if value > high:
        return high
    return value
'''


def test_links_binary_large_special_and_virtualenv_files_are_skipped_and_counted(tmp_path):
    outside = write(tmp_path / "outside", {"secret.py": documented("secret")})
    root = write(tmp_path / "proj", {
        "stats.py": DOCUMENTED,
        "blob.py": b"def f():\n    pass\n\x00\x01\x02",
        "big.py": DOCUMENTED + "# padding\n" * 200,
        "env/pyvenv.cfg": "home = /usr/bin\n",
        "env/lib/helpers.py": documented("helper"),
        "crlf.py": documented("crlf_mean").replace("\n", "\r\n"),
        "bom.py": b"\xef\xbb\xbf" + documented("bom_mean").encode(),
    })  # fmt: skip
    (root / "linked.py").symlink_to(outside / "secret.py")
    (root / "linked_dir").symlink_to(outside, target_is_directory=True)
    os.mkfifo(root / "pipe.py")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "sock.py"))
    (root / "b\udcffd.py").write_text(DOCUMENTED)  # a file name that is not UTF-8
    report = MiningReport()
    rows = list(mine([root], report=report, max_file_bytes=len(DOCUMENTED) + 100))
    server.close()
    skipped = report.files.skipped["code root proj"]
    assert skipped[tree_walk.SYMLINK] == 2 and skipped[tree_walk.SPECIAL] == 2
    assert skipped[tree_walk.BINARY] == 1 and skipped[tree_walk.TOO_LARGE] == 1
    assert skipped[tree_walk.VIRTUALENV] == 1 and skipped["file name not UTF-8"] == 1
    assert report.files.examples["code root proj", "file name not UTF-8"] == ["proj/b\\xffd.py"]
    assert {r["function"] for r in rows} == {"mean", "crlf_mean", "bom_mean"}
    crlf = next(r for r in rows if r["function"] == "crlf_mean" and r["dataset"] == T2C)
    plain = next(r for r in rows if r["function"] == "mean" and r["dataset"] == T2C)
    assert crlf["positive"] == plain["positive"].replace("def mean", "def crlf_mean")  # no \r left
    assert crlf["query"] == plain["query"] == "Arithmetic mean of a list of numbers, zero for an empty list."


def test_nested_gitignore_rules(tmp_path):
    root = write(tmp_path / "proj", {
        ".gitignore": "*.gen.py\nbuild_out/\n",
        "a.py": DOCUMENTED,
        "b.gen.py": documented("b"),
        "sub/.gitignore": "!keep.gen.py\nlocal_*.py\n",
        "sub/keep.gen.py": documented("keep"),
        "sub/drop.gen.py": documented("drop"),
        "sub/local_x.py": documented("local"),
        "build_out/c.py": documented("c"),
        "other/local_y.py": documented("other_local"),  # the nested rule does not reach here
    })  # fmt: skip
    report = MiningReport()
    functions = {r["function"] for r in mine([root], report=report)}
    assert functions == {"mean", "keep", "other_local"}
    assert report.files.examples["code root proj", tree_walk.GITIGNORED] == [
        "proj/b.gen.py", "proj/build_out/", "proj/sub/drop.gen.py", "proj/sub/local_x.py"]  # fmt: skip


def test_crafted_names_and_gitignore_lines_are_counted_not_fatal(tmp_path):
    root = write(tmp_path / "proj", {
        ".gitignore": "!\n*.gen.py\n\\\n",  # "!" and a lone backslash are patterns git matches nothing with
        "a.py": DOCUMENTED,
        "b.gen.py": documented("b"),
        "notes\n.txt": "a file name with a line break",
        "line\nbreak.py": documented("line_break"),
    })  # fmt: skip
    report = MiningReport()
    rows = list(mine([root], report=report))
    assert {r["function"] for r in rows} == {"mean", "line_break"}
    assert "proj/line\nbreak.py" in {r["file"] for r in rows}  # the id is the real name
    examples = report.files.examples
    assert examples["code root proj", "invalid .gitignore pattern (ignored)"] == [
        "proj/.gitignore:1",
        "proj/.gitignore:3",
    ]
    assert examples["code root proj", tree_walk.GITIGNORED] == ["proj/b.gen.py"]
    assert examples["code root proj", tree_walk.UNSUPPORTED] == ["proj/notes\\x0a.txt"]  # one line in a report
    odd = tmp_path / "r\udcff"  # a folder name that is not UTF-8
    write(odd, {"a.py": DOCUMENTED})
    with pytest.raises(DataError, match=r"code root '.*r\\xff'.*is not UTF-8"):
        mine([odd])


def test_bad_roots_are_errors_naming_them(tmp_path, monkeypatch):
    with pytest.raises(DataError, match=r"does not exist .*missing.*relative paths resolve from the folder the "):
        mine([tmp_path / "missing"])
    (tmp_path / "file.py").write_text(DOCUMENTED)
    with pytest.raises(DataError, match=r"'.*file\.py' is a file, not a folder"):
        mine([tmp_path / "file.py"])
    with pytest.raises(DataError, match="code_roots is empty"):
        mine([])
    with pytest.raises(DataError, match="must be a list of folders, got str"):
        mine(str(FIXTURE))
    with pytest.raises(DataError, match="is given twice"):
        mine([FIXTURE, FIXTURE / "." / ".." / "own-code"])
    with pytest.raises(DataError, match="lies inside code root"):
        mine([FIXTURE, FIXTURE / "python"])
    write(tmp_path / "a" / "src", {"x.py": DOCUMENTED})
    write(tmp_path / "b" / "src", {"y.py": documented("y")})
    with pytest.raises(DataError, match="have the same folder name 'src'"):
        mine([tmp_path / "a" / "src", tmp_path / "b" / "src"])
    with pytest.raises(ValueError, match="test_percent must be an integer from 0 to 100"):
        mine([FIXTURE], test_percent=101)
    monkeypatch.setattr(tree_walk.os, "access", lambda path, mode: False)
    with pytest.raises(DataError, match="code root .* cannot be read"):
        mine([FIXTURE])


def test_a_root_without_source_or_without_pairs_is_an_error_naming_it(tmp_path):
    docs = write(tmp_path / "docs", {"README.md": "# docs\n", "tests/test_x.py": DOCUMENTED})
    with pytest.raises(DataError, match=r"code root 'docs' \(.*\) has no source file to mine .*skipped: 1 no "
                                        r"supported language \(by extension\), 1 test folder or file"):  # fmt: skip
        list(mine([docs]))
    bare = write(tmp_path / "bare", {"tiny.py": "def f(x):\n    return x\n"})
    with pytest.raises(DataError, match=r"code root 'bare' \(.*\) yields no pair"):
        list(mine([bare]))


def test_an_unreadable_subfolder_is_counted_not_fatal(tmp_path, monkeypatch):
    root = write(tmp_path / "proj", {"a.py": DOCUMENTED, "locked/b.py": documented("b")})
    real = os.scandir

    def scandir(path):
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(tree_walk.os, "scandir", scandir)
    report = MiningReport()
    assert {r["function"] for r in mine([root], report=report)} == {"mean"}
    assert report.files.examples["code root proj", tree_walk.UNREADABLE] == ["proj/locked/"]


@pytest.mark.parametrize(
    ("doc", "comment", "query"),
    [
        ("/**\n * Sums two numbers.\n * @param a first\n */", True, "Sums two numbers."),
        ("/** {@inheritDoc} */", True, ""),
        ("/// <summary>\n/// Gets the <paramref name=\"key\"/> value.\n/// </summary>", True, "Gets the key value."),
        ("/**\n * \\brief Opens a file for reading.\n * \\param path where\n */", True, "Opens a file for reading."),
        ("# rubocop:disable Metrics\n# Loads the configuration file.", True, "Loads the configuration file."),
        ("Reads a file.\n:param path: where\n:returns: the text", False, "Reads a file."),
        ("Compares <b>two</b> values &amp; returns the larger.<p>More.", True,
         "Compares two values & returns the larger."),
    ],
)  # fmt: skip
def test_summary_of_cleans_markers_and_tags(doc, comment, query):
    assert summary_of(doc, comment) == query


def test_code_roots_names_and_resolves(tmp_path, monkeypatch):
    monkeypatch.chdir(FIXTURE)
    assert code_roots(["python", "go"]) == [("python", FIXTURE / "python"), ("go", FIXTURE / "go")]
    assert code_roots(["."]) == [("own-code", FIXTURE)]


def test_prepare_code_trains_on_the_train_split_and_returns_the_held_out_one():
    prepared = prepare_code([FIXTURE])
    heldout = prepared.heldout
    assert set(heldout["split"]) == {"test"} and len(heldout) == 47
    assert {"file", "function", "start_line", "end_line"} <= set(heldout.column_names)
    held_texts = {text_key(t) for t in list(heldout["query"]) + list(heldout["positive"])}
    assert not held_texts & {text_key(t) for t in list(prepared.rows["query"]) + list(prepared.rows["positive"])}
    assert prepared.kept[T2C] + prepared.kept[C2C] == len(prepared.rows) == 137
    assert prepared.report.skipped[ROOT][code_trees.NOT_PARSED] == 2  # the mining's file counts are in the report
    assert prepared.summary()["heldout_rows"] == 47


def test_train_rows_sharing_text_with_held_out_or_mteb_texts_are_decontaminated(tmp_path):
    shared = documented("shared_mean", "scores").replace("return 0.0", "return 0")  # not `mean`'s body: see below
    files = {"copy_b.py": DOCUMENTED + "\n\n" + shared + "\n\n" + CLAMP, "copy_a.py": shared}
    assert (split_of("copy_b.py"), split_of("copy_a.py")) == ("train", "test")
    root = write(tmp_path / "proj", files)
    prepared = prepare_code([root])
    assert {r["function"] for r in prepared.heldout} == {"shared_mean"}
    # counted as held-out text, the rule they broke (were: "offline evaluation text", the offline sets' rule)
    assert prepared.decontaminated[T2C] == {HELDOUT_TEXT: 1}  # the copy in the train file
    # both train functions end with the same three lines as the held-out one: both continuations go
    assert prepared.decontaminated[C2C] == {HELDOUT_TEXT: 2}
    assert prepared.decontamination()[T2C][OFFLINE_EVAL_TEXT] == 0
    mean_query, clamp_query = DOCUMENTED.split('"""')[1], CLAMP.split('"""')[1]
    # left: mean's text pair, clamp's two pairs
    assert Counter(prepared.rows["dataset"]) == {T2C: 2, C2C: 1}
    assert {mean_query, clamp_query} <= set(prepared.rows["query"])
    prepared = prepare_code([root], mteb_keys=({text_key(mean_query)}, set()))
    assert prepared.decontaminated[T2C]["query is a test query"] == 1
    assert Counter(prepared.rows["dataset"]) == {T2C: 1, C2C: 1} and mean_query not in set(prepared.rows["query"])


RENAMED = documented("arithmetic_mean", "scores").replace("(values):", "(values, *, strict=False):")
JS_HELD = """/** Sum of the numbers in an array, zero when it is empty. */
function sum(xs) {
  let total = 0;
  for (const x of xs) {
    total += Number(x);
  }
  return total;
}
"""
JS_RENAMED = """/** Adds up every element of a list. */
export const addAll = (xs, start) => {
  let total = 0;
  for (const x of xs) {
    total += Number(x);
  }
  return total;
};
"""
TRIVIAL_HELD = 'def nothing_here(x):\n    """Return nothing at all for any input."""\n    return None\n'
TRIVIAL_TRAIN = 'def no_value(y):\n    """Give back no value whatsoever, ever."""\n    return None\n'


def test_a_renamed_copy_of_a_held_out_function_does_not_train(tmp_path):
    """The same body under another name or signature (and another documentation): both pairs of the train copy are
    held-out text, in Python and JavaScript; a body under MIN_BODY_CHARS (`return None`) is not compared."""
    files = {"copy_a.py": DOCUMENTED + "\n\n" + TRIVIAL_HELD, "copy_b.py": f"{RENAMED}\n\n{TRIVIAL_TRAIN}\n\n{CLAMP}",
             "held.js": JS_HELD, "train.js": JS_RENAMED}  # fmt: skip
    assert [split_of(f) for f in files] == ["test", "train", "test", "train"]
    root = write(tmp_path / "proj", files)
    prepared = prepare_code([root])
    assert {r["function"] for r in prepared.heldout} == {"mean", "nothing_here", "sum"}
    trained = set(prepared.rows["query"])
    copies = {"Arithmetic mean of a list of scores, zero for an empty list.", "Adds up every element of a list."}
    assert not copies & trained  # was: both renamed copies trained as text->code pairs
    assert not any("arithmetic_mean" in q or "addAll" in q for q in trained)  # nor as code->code pairs
    assert "Give back no value whatsoever, ever." in trained  # `return None` is too short to tell functions apart
    assert "Limit a value to the closed interval from low to high." in trained
    # text->code: the copy's own documentation and signature, so only its body matches; code->code: its second half
    # is the held-out one's too, which the whole-text rule already caught
    assert prepared.decontaminated[T2C] == {HELDOUT_TEXT: 2} and prepared.decontaminated[C2C] == {HELDOUT_TEXT: 2}
    assert "body_key" not in prepared.heldout.column_names and "body_key" not in prepared.rows.column_names
    [source] = [s for s in source_files(code_roots([root]), SkipReport()) if s.rel == "train.js"]
    body = every_function(source, SkipReport())[0].body  # from the grammar's body node: no name, no signature
    assert normalize_text(body) == "{ let total = 0; for (const x of xs) { total += Number(x); } return total; }"


def test_a_held_out_pair_whose_query_equals_its_positive_is_left_out(tmp_path):
    """A function whose first half reads as its second (a nested copy of itself): held out, its code->code pair would
    score 100 for every model, BM25 included."""
    twice = 'def twice(values):\n    """Run the same steps again inside."""\n    total = 0\n    count = 1\n' + (
        "    def twice(values):\n        total = 0\n        count = 1\n"
    )
    root = write(tmp_path / "proj", {"copy_a.py": DOCUMENTED + "\n\n" + twice, "copy_b.py": CLAMP})
    prepared = prepare_code([root])
    assert sorted(zip(prepared.heldout["function"], prepared.heldout["dataset"], strict=True)) == [
        ("mean", C2C), ("mean", T2C), ("twice", T2C)]  # fmt: skip
    assert prepared.report.as_dict()[C2C]["examples"] == {
        "query equals its positive (held out)": ["proj/copy_a.py:11 twice"]
    }


def test_no_held_out_file_is_an_error(tmp_path):
    root = write(tmp_path / "proj", {"copy_b.py": DOCUMENTED})
    with pytest.raises(DataError, match=r"no file fell in the held-out split \(1 files mined, 20 % held out"):
        prepare_code([root])


def test_build_training_data_code_branch_keeps_held_out_through_negatives():
    stage = DataStage(data_source="code", code_roots=[str(FIXTURE)], num_negatives=2, rows_per_group=4, seed=3)
    prepared, short = build_training_data(stage)
    assert len(prepared.heldout) == 47  # survives add_hard_negatives
    groups = Counter(zip(prepared.rows["dataset"], prepared.rows["language"], strict=True))
    assert max(groups.values()) == 4 and groups[(T2C, "python")] == 4
    for row in prepared.rows:  # K = 2 negatives from the row's own group where it has 2 other rows
        assert len(row["negatives"]) == min(2, groups[row["dataset"], row["language"]] - 1)
    assert short["CodeSearchNetRetrieval/c"] == 2  # the C group has 2 rows: 1 negative each
    again, _ = build_training_data(stage)
    assert again.fingerprint == prepared.fingerprint and list(again.rows["query"]) == list(prepared.rows["query"])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"data_source": "code"}, "'code_roots' must name at least one folder of source code, e.g. --set .*notebooks/"),
        ({"code_roots": ["src"]}, "'code_roots' is mined only with data_source 'code', not 'offline'"),
        ({"data_source": "code", "code_roots": [" "]}, "'code_roots' must be folder paths"),
        ({"data_source": "code", "code_roots": ["a", "a"]}, "'code_roots' repeats a folder"),
        ({"data_source": "code", "code_roots": ["a"], "code_test_percent": 0}, "'code_test_percent' must be from 1"),
        ({"data_source": "code", "code_roots": "src"}, "'code_roots' must be list"),
    ],
)
def test_data_stage_validates_the_code_keys(values, message):
    with pytest.raises(ConfigError, match=message):
        DataStage(**values)


def test_the_mining_benchmark_writes_counts_rates_and_memory(tmp_path):
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "code_mining_bench.py"
    spec = importlib.util.spec_from_file_location("code_mining_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--root", str(FIXTURE), "--out", str(tmp_path)])
    result = json.loads((tmp_path / "code-mining.json").read_text())
    assert (result["files_mined"], result["pairs"], result["files_or_folders_skipped"]) == (29, 184, 22)
    assert result["pairs_per_s"] > 0 and result["peak_rss_mib"] >= result["rss_after_imports_mib"] > 0
    assert "| files mined (parsed) | 29 |" in (tmp_path / "code-mining.md").read_text()
    bench.main(["--root", str(FIXTURE), "--limit", "3", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "code-mining.json").read_text())["files_mined"] == 3
