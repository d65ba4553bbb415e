"""Notebook 07's search (c2llm_lib/search/) on a tiny fixture folder and the tiny random model: the documents and
their lines, the index against `encode`, saving and reuse, re-encoding only what changed, the bound on files, the
plan said before encoding, a killed indexing, the threshold, known answers, errors naming what is wrong, the HTML
and the widget, and the time a query takes over a few thousand documents. Scores of the tiny model mean nothing:
the tests check ranks against an independent computation, never against an expectation of quality."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from c2llm_lib.checks import ConfigError
from c2llm_lib.config import SearchStage
from c2llm_lib.data.offline import split_of
from c2llm_lib.data.records import DataError
from c2llm_lib.files import CorruptFile, fingerprint
from c2llm_lib.runs import RunDir
from c2llm_lib.search.index import (
    FileState,
    SearchIndex,
    index_payload,
    index_settings,
    previous_index,
    read_index,
    update_index,
)
from c2llm_lib.search.searcher import Searcher, pick_queries, result_html, results_page, search_metrics, search_widget
from c2llm_lib.search.sources import Document, KnownQuery, offline_sources, search_sources

from conftest import build_tiny

GEOMETRY = '''import math


def circle_area(radius):
    """Compute the area of a circle from its radius in metres."""
    return math.pi * radius * radius


def double_plus_one(x):
    return x * 2 + 1


class Shape:
    @staticmethod
    def perimeter(sides):
        """Add up the lengths of every side of a polygon."""
        total = 0
        for side in sides:
            total += side
        return total
'''
TEXT_JS = """/**
 * Reverse the order of the words of a sentence.
 */
function reverseWords(s) {
  return s.split(" ").reverse().join(" ");
}

const shout = (s) => s.toUpperCase();
"""
STATS = '''def mean(values):
    """Arithmetic mean of a list of numbers, zero for an empty list."""
    return sum(values) / len(values) if values else 0.0
'''


def write_tree(root: Path) -> Path:
    files = {"pkg/geometry.py": GEOMETRY, "pkg/text.js": TEXT_JS, "stats.py": STATS, "notes.txt": "not code",
             "tests/test_geometry.py": "def test_x():\n    pass\n"}  # fmt: skip
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture(scope="module")
def encoder():
    return build_tiny(pma_heads=4)


@pytest.fixture
def tree(tmp_path):
    return write_tree(tmp_path / "proj")


def build(encoder, root, previous=None, max_length=64, log=None, **kwargs):
    stage = SearchStage(search_roots=[str(root)])
    lines = [] if log is None else log
    index, report = update_index(encoder, search_sources(stage), previous, index_settings(encoder, "tiny", max_length),
                                 log=lines.append, **kwargs)  # fmt: skip
    return index, report


def test_every_function_is_a_document_with_its_file_and_lines(encoder, tree):
    index, report = build(encoder, tree)
    found = {(d.file, d.function): d for d in index.documents}
    assert sorted(found) == [("proj/pkg/geometry.py", "circle_area"), ("proj/pkg/geometry.py", "double_plus_one"),
                             ("proj/pkg/geometry.py", "perimeter"), ("proj/pkg/text.js", "reverseWords"),
                             ("proj/pkg/text.js", "shout"), ("proj/stats.py", "mean")]  # fmt: skip
    lines = {k: (d.start_line, d.end_line, d.language) for k, d in found.items()}
    assert lines["proj/pkg/geometry.py", "circle_area"] == (4, 6, "python")
    assert lines["proj/pkg/geometry.py", "double_plus_one"] == (9, 10, "python")  # undocumented: indexed too
    assert lines["proj/pkg/geometry.py", "perimeter"] == (14, 20, "python")  # from its decorator
    assert lines["proj/pkg/text.js", "reverseWords"] == (4, 6, "javascript")
    circle = found["proj/pkg/geometry.py", "circle_area"]
    assert circle.code == "def circle_area(radius):\n    return math.pi * radius * radius"  # no docstring
    assert circle.summary == "Compute the area of a circle from its radius in metres."
    assert found["proj/pkg/text.js", "reverseWords"].code.startswith("function reverseWords")  # no JSDoc
    assert list(index.files) == ["proj/pkg/geometry.py", "proj/pkg/text.js", "proj/stats.py"]  # walk order
    assert report.files.skipped["code root proj"] == {"no supported language (by extension)": 1,
                                                      "test folder or file": 1}  # fmt: skip


def test_the_index_holds_encodes_embeddings_and_the_pma_attention(encoder, tree):
    index, _ = build(encoder, tree, max_length=24)
    settings = index.settings
    texts = [d.code for d in index.documents]
    expected = encoder.encode(texts, kind="document", instruction=settings["document_instruction"], max_length=24)
    np.testing.assert_allclose(index.embeddings, expected, atol=1e-5)
    lengths = encoder.token_lengths(encoder.format_texts(texts, "document", settings["document_instruction"]), 24)
    assert [len(a) for a in index.attention] == lengths  # one weight per token the model saw (cut at 24)
    assert all(abs(float(a.sum()) - 1) < 1e-4 for a in index.attention)
    from c2llm_lib.attention import pma_attention

    first = pma_attention(encoder, texts[:1], "document", settings["document_instruction"], max_tokens=24)[0]
    np.testing.assert_allclose(index.attention[0], first.weights.mean(0), atol=1e-5)  # notebook 05's attention


def test_saved_index_round_trips_and_an_unchanged_folder_encodes_nothing(encoder, tree, tmp_path):
    run = RunDir.open("r", tmp_path / "outputs")
    index, _ = build(encoder, tree, save=run.save_search_index)
    assert sorted(p.name for p in run.search_index_dir.iterdir()) == ["index.json", "tensors.safetensors"]
    back = read_index(run.search_index_dir)
    assert back.documents == index.documents and back.files == index.files and back.settings == index.settings
    np.testing.assert_array_equal(back.embeddings, index.embeddings)
    assert all(np.array_equal(a, b) for a, b in zip(back.attention, index.attention, strict=True))
    lines = []
    again, report = build(encoder, tree, previous=back, log=lines)
    assert report.encoded_documents == 0 and report.reused_files == 3 and report.new_files == 0
    assert lines == ["nothing to encode: 3 files unchanged since the index was built"]
    np.testing.assert_array_equal(again.embeddings, index.embeddings)


def test_only_changed_and_new_files_are_encoded_and_removed_ones_dropped(encoder, tree):
    index, _ = build(encoder, tree)
    old = {d.where: index.embeddings[i] for i, d in enumerate(index.documents)}
    (tree / "stats.py").write_text(STATS.replace("zero for", "nought for"))  # changed content
    (tree / "pkg" / "text.js").unlink()  # removed
    (tree / "extra.py").write_text("def twice(x):\n    return 2 * x\n")  # new
    os.utime(tree / "pkg" / "geometry.py", ns=(1, 1))  # touched: the same content
    encoded = []
    real = encoder.forward
    encoder.forward = lambda input_ids, attention_mask, **kw: (encoded.append(input_ids.shape[0]), real(
        input_ids, attention_mask, **kw))[1]  # fmt: skip
    try:
        updated, report = build(encoder, tree, previous=index)
    finally:
        del encoder.forward
    assert (report.reused_files, report.changed_files, report.new_files, report.removed_files) == (1, 1, 1, 1)
    assert report.encoded_documents == 2 == sum(encoded)  # mean and twice, nothing else went through the model
    assert list(updated.files) == ["proj/extra.py", "proj/pkg/geometry.py", "proj/stats.py"]
    assert updated.files["proj/pkg/geometry.py"].mtime_ns == 1  # the touched file's new fingerprint is kept
    for i, d in enumerate(updated.documents):
        if d.file == "proj/pkg/geometry.py":
            np.testing.assert_array_equal(updated.embeddings[i], old[d.where])


def test_another_model_or_length_encodes_everything_again(encoder, tree):
    index, _ = build(encoder, tree, max_length=64)
    again, report = build(encoder, tree, previous=index, max_length=32)
    assert report.encoded_documents == len(again) == 6 and report.reused_files == 0
    assert report.notes == ["the index was built with other settings (max_length): every file is encoded again"]


def test_the_model_is_named_by_its_folder_s_files(encoder, tmp_path):
    """`index_settings` names a model folder by its `files.fingerprint` (a retrained model differs), a name as given."""
    model = tmp_path / "merged"
    model.mkdir()
    (model / "weights.safetensors").write_bytes(b"one")
    first = index_settings(encoder, model, 64)["model"]
    assert first == f"merged:{fingerprint(model, 'merged')}" and index_settings(encoder, "tiny", 64)["model"] == "tiny"
    (model / "weights.safetensors").write_bytes(b"two")
    assert index_settings(encoder, model, 64)["model"] != first


def test_search_max_files_bounds_the_index(encoder, tree):
    index, report = build(encoder, tree, max_files=2)
    assert list(index.files) == ["proj/pkg/geometry.py", "proj/pkg/text.js"] and report.beyond_max_files == 1
    assert "1 left out by search_max_files" in report.lines()[-2]


def test_the_plan_and_the_measured_estimate_come_before_the_encoding(encoder, tmp_path):
    root = tmp_path / "big"
    root.mkdir()
    for f in range(6):
        (root / f"m{f}.py").write_text("".join(f"def f{f}_{i}(x):\n    return x + {i}\n\n\n" for i in range(20)))
    events = []
    real = encoder.forward
    encoder.forward = lambda *a, **kw: (events.append("forward"), real(*a, **kw))[1]
    try:
        index, report = build(encoder, root, log=events, max_length=32)
    finally:
        del encoder.forward
    plan, measured = events[0], next(e for e in events[1:] if e != "forward")  # nothing encoded before the plan
    lengths = encoder.token_lengths(encoder.format_texts([d.code for d in index.documents], "document",
                                                         index.settings["document_instruction"]), 32)  # fmt: skip
    assert plan == (f"to encode: 120 functions of 6 files, {sum(lengths):,} tokens (0 functions cut to 32 tokens); "
                    "reused: 0 unchanged files")  # fmt: skip
    assert measured.startswith("measured on 16 of them (") and "tokens/s on cpu; the other" in measured
    at = events.index(measured)
    assert set(events[1:at]) == {"forward"} and events[at + 1] == "forward"  # the sample, the estimate, the rest
    assert report.probe_tokens_per_s > 0 and report.estimated_seconds >= 0


def test_a_killed_indexing_keeps_the_files_it_had_encoded(encoder, tmp_path, monkeypatch):
    root = tmp_path / "big"
    root.mkdir()
    for f in range(5):
        (root / f"m{f}.py").write_text("".join(f"def f{f}_{i}(x):\n    return x * {i}\n\n\n" for i in range(4)))
    run = RunDir.open("r", tmp_path / "outputs")
    import c2llm_lib.search.index as search

    monkeypatch.setattr(search, "CHUNK", 4)  # one file per chunk
    monkeypatch.setattr(search, "PROBE", 1)
    calls = {"n": 0}
    real = search._encode

    def dies(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:  # the probe, then two files, then the kill
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(search, "_encode", dies)
    with pytest.raises(KeyboardInterrupt):
        build(encoder, root, save=run.save_search_index, save_every=0.0)
    kept = read_index(run.search_index_dir)
    assert list(kept.files) == ["big/m0.py", "big/m1.py"] and len(kept) == 8  # whole files only
    monkeypatch.setattr(search, "_encode", real)
    index, report = build(encoder, root, previous=kept)
    assert report.reused_files == 2 and report.new_files == 3 and len(index) == 20


def test_search_ranks_against_an_independent_computation_and_the_threshold(encoder, tree):
    index, _ = build(encoder, tree)
    searcher = Searcher(index, encoder)
    query = KnownQuery("add the lengths of every side", "proj/pkg/geometry.py", "perimeter", 14)
    result = searcher.search(query, k=3, min_score=-1.0)
    q = encoder.encode([query.text], kind="query", instruction=index.settings["query_instruction"], max_length=64)[0]
    cosines = index.embeddings @ q
    order = np.argsort(-cosines, kind="stable")
    assert [h.index for h in result.model] == order[:3].tolist()
    np.testing.assert_allclose([h.score for h in result.model], cosines[order[:3]], atol=1e-5)
    target = next(i for i, d in enumerate(index.documents) if d.function == "perimeter")
    assert result.model_rank == 1 + int((cosines > cosines[target]).sum())
    assert [h.index for h in result.bm25] == [target] and result.bm25_rank == 1  # the only one sharing a word
    assert result.bm25[0].score > 0
    none = searcher.search(query, k=3, min_score=1.0)
    assert none.model == [] and none.best.index == order[0]
    assert "No hit scores above search_min_score = 1 (the best: " in result_html(searcher, none)
    nothing = searcher.search("zzzz qqqq", k=3, min_score=-1.0)
    assert nothing.bm25 == [] and "No indexed function shares a word with the query." in result_html(searcher, nothing)
    with pytest.raises(ValueError, match="a query must be a non-empty text"):
        searcher.search("   ")


def test_a_query_takes_under_a_second_over_3000_documents(encoder):
    rng = np.random.default_rng(0)
    n, words = 3000, ["parse", "json", "file", "sort", "list", "http", "read", "write", "cache", "token"]
    docs = [Document(f"p/m{i // 30}.py", f"f{i}", "python", 1, 3,
                     f"def f{i}(x):\n    return {' '.join(rng.choice(words, 8))}(x)") for i in range(n)]  # fmt: skip
    vectors = rng.normal(size=(n, encoder.embedding_dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    files = {f"p/m{f}.py": FileState(1, 1, "x", 30) for f in range(n // 30)}
    index = SearchIndex(index_settings(encoder, "tiny", 64), files, docs, vectors, None)
    searcher = Searcher(index, encoder)
    searcher.search("warm up", k=5)
    timings = []
    for query in ("read a json file", "sort a list of tokens", "write the cache to http"):
        start = time.perf_counter()
        result = searcher.search(query, k=5)
        timings.append(time.perf_counter() - start)
        assert len(result.model) == 5 and len(result.bm25) == 5
    assert max(timings) < 1.0, timings


def test_known_answer_queries_are_picked_once_and_the_same_every_time(encoder, tree):
    index, _ = build(encoder, tree)
    sources = search_sources(SearchStage(search_roots=[str(tree)]))
    stage = SearchStage(search_roots=[str(tree)], search_query_count=2)
    picked = pick_queries(stage, sources, index)
    assert picked == pick_queries(stage, sources, index) and len(picked) == 2
    documented = {("proj/pkg/geometry.py", "circle_area"), ("proj/pkg/geometry.py", "perimeter"),
                  ("proj/pkg/text.js", "reverseWords"), ("proj/stats.py", "mean")}  # fmt: skip
    assert {(q.file, q.function) for q in picked} <= documented
    every = pick_queries(SearchStage(search_roots=[str(tree)], search_query_count=10), sources, index)
    assert {(q.file, q.function) for q in every} == documented  # 3+ words of documentation each
    given = pick_queries(SearchStage(search_roots=[str(tree)], search_queries=["sort things"]), sources, index)
    assert given == [KnownQuery("sort things")] and not given[0].known
    sources.heldout = [KnownQuery("gone", "proj/other.py", "f")]
    with pytest.raises(DataError, match="none of the 1 known-answer queries has its function among the 3 files"):
        pick_queries(stage, sources, index)


def test_the_default_sources_of_the_offline_and_code_runs(tmp_path):
    stdlib = tmp_path / "lib"
    (stdlib / "json").mkdir(parents=True)
    (stdlib / "json" / "encoder.py").write_text("def f():\n    pass\n")
    sources = offline_sources(stdlib)
    assert sources.roots == [("python", stdlib)] and sources.keep("python/json/encoder.py")
    assert not sources.keep("python/json/decoder.py")
    assert sources.heldout and {q.file for q in sources.heldout} == {"python/json/encoder.py"}
    assert any("held-out files of lodash not searched: lodash is not installed" in n for n in sources.notes)
    assert any(n.startswith("not in this standard library, skipped: ") for n in sources.notes)
    with pytest.raises(DataError, match="none of the offline snapshot's .* held-out Python files is in"):
        offline_sources(tmp_path / "nowhere")
    real = offline_sources()  # this machine's standard library holds the snapshot's files
    assert real.heldout and real.roots[0][1].is_dir()
    tree = write_tree(tmp_path / "proj")
    code = search_sources(SearchStage(data_source="code", code_roots=[str(tree)], code_test_percent=50))
    assert code.roots == [("proj", tree)] and code.heldout is None
    for rel in ("pkg/geometry.py", "pkg/text.js", "stats.py"):
        assert code.keep(f"proj/{rel}") == (split_of(rel, 50) == "test")
    with pytest.raises(DataError, match="data_source 'files' holds query-document pairs, not source files: name"):
        search_sources(SearchStage(data_source="files"))
    with pytest.raises(DataError, match="data_source 'code' names no code_roots"):
        search_sources(SearchStage(data_source="code"))


def test_bad_folders_are_named(encoder, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=r"code root 'empty' \(.*empty\) has no source file"):
        build(encoder, empty)
    prose = tmp_path / "prose"
    prose.mkdir()
    (prose / "README.md").write_text("# hello\n")
    with pytest.raises(DataError, match=r"code root 'prose' .* skipped: 1 no supported language"):
        build(encoder, prose)
    with pytest.raises(DataError, match=r"code root '.*missing' does not exist"):
        search_sources(SearchStage(search_roots=[str(tmp_path / "missing")]))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "constants.py").write_text("A = 1\n")
    with pytest.raises(DataError, match=r"no function to index in 1 files under .*bare"):
        build(encoder, bare)


def test_unreadable_and_special_files_are_skipped_and_named(encoder, tree, monkeypatch):
    os.mkfifo(tree / "pipe.py")
    (tree / "link.py").symlink_to(tree / "stats.py")
    import c2llm_lib.data.tree_walk as tree_walk

    real = tree_walk.os.open

    def refuse(path, *args, **kwargs):
        if str(path).endswith("text.js"):
            raise PermissionError(13, "Permission denied")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(tree_walk.os, "open", refuse)
    index, report = build(encoder, tree)
    assert "proj/pkg/text.js" not in index.files
    lines = "\n".join(report.lines())
    for shown in ("unreadable, e.g. proj/pkg/text.js", "not a regular file, e.g. proj/pipe.py",
                  "symbolic link (not followed), e.g. proj/link.py"):  # fmt: skip
        assert shown in lines, lines


def test_a_corrupt_index_is_named_and_built_again(encoder, tree, tmp_path):
    run = RunDir.open("r", tmp_path / "outputs")
    index, _ = build(encoder, tree, save=run.save_search_index)
    tensors = run.search_index_dir / "tensors.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:100])
    with pytest.raises(CorruptFile, match="tensors.safetensors: the search index vectors file is corrupt"):
        read_index(run.search_index_dir)
    said = []
    assert previous_index(run.search_index_dir, said.append) is None and "built again" in said[0]
    run.save_search_index(index_payload(index))
    record = json.loads((run.search_index_dir / "index.json").read_text())
    record["documents"] = record["documents"][:-1]
    (run.search_index_dir / "index.json").write_text(json.dumps(record))
    with pytest.raises(CorruptFile, match="the search index is inconsistent"):
        read_index(run.search_index_dir)
    record = json.loads(index_payload(index)["index.json"])
    record["documents"] = record["documents"][-1:] + record["documents"][:-1]  # all there, out of file order
    run.save_search_index({**index_payload(index), "index.json": json.dumps(record).encode()})
    with pytest.raises(CorruptFile, match="do not follow them"):
        read_index(run.search_index_dir)
    with pytest.raises(ValueError, match="not a plain file name"):
        run.save_search_index({"../escape.json": b"{}"})
    assert not (run.search_index_dir.parent / "escape.json").exists()


def test_the_hits_html_shades_each_hit_and_marks_the_expected_one(encoder, tree):
    index, report = build(encoder, tree)
    searcher = Searcher(index, encoder)
    query = KnownQuery("add the lengths of every side", "proj/pkg/geometry.py", "perimeter", 14)
    result = searcher.search(query, k=6, min_score=-1.0)
    html = result_html(searcher, result)
    assert "<table class='c2llm-hits'" in html and html.count("class='c2llm-hit'") == 6 + len(result.bm25)
    assert "proj/pkg/geometry.py:14-20" in html and "&#10003; the expected function" in html
    assert "rgba(178,24,43," in html or "rgba(33,102,172," in html  # tokens shaded by attention
    assert f"the model returns it at rank {result.model_rank}, BM25 at 1." in html
    page = results_page(searcher, [result], "t")
    assert page.startswith("<!DOCTYPE html>") and "shaded by the PMA head" in page
    sources = search_sources(SearchStage(search_roots=[str(tree)]))
    metrics = json.loads(json.dumps(search_metrics(index, report, [result], sources, searcher)))  # as it is saved
    assert metrics["queries"][0]["bm25_rank"] == 1 and metrics["summary"]["bm25_top1"] == 1
    assert metrics["queries"][0]["expected"] == {"file": "proj/pkg/geometry.py", "function": "perimeter"}
    assert metrics["index"]["documents"] == 6 and metrics["index"]["new_files"] == 3


def test_a_model_without_pma_says_it_has_no_attention_to_shade(tree):
    mean = build_tiny(pooling="mean")
    index, _ = build(mean, tree)
    assert index.attention is None
    searcher = Searcher(index, mean)
    html = result_html(searcher, searcher.search("circle area", k=2, min_score=-1.0))
    assert "This model pools by 'mean': it has no attention to shade." in html and "rgba(" not in html
    with pytest.raises(ValueError, match="the index was built by a model with"):
        Searcher(index, build_tiny(pma_heads=4))


def test_the_widget_searches_on_enter_and_shows_errors(encoder, tree):
    index, _ = build(encoder, tree)
    widget = search_widget(Searcher(index, encoder), k=2, min_score=-1.0)
    box, button = widget.children[0].children
    out = widget.children[1]
    box.value = "area of a circle"  # Enter (continuous_update=False) sets the value
    assert "<table class='c2llm-hits'" in out.value and "area of a circle" in out.value
    box.value = "   "
    assert "ValueError: a query must be a non-empty text" in out.value
    box.value = "reverse words"
    button.click()
    assert "reverse words" in out.value


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"search_top_k": 0}, "'search_top_k' must be from 1 to 100"),
        ({"search_min_score": 2.0}, "'search_min_score' is a cosine, from -1 to 1"),
        ({"search_max_files": 0}, "'search_max_files' must be at least 1, or None"),
        ({"search_roots": ["a", "a"]}, "'search_roots' repeats a folder"),
        ({"search_queries": [""]}, "'search_queries' holds an empty query"),
        ({"search_max_length": 4}, "'search_max_length' must be from 8"),
        ({"data_source": "web"}, "'data_source' must be one of"),
    ],
)
def test_the_search_stage_names_a_bad_value(values, message):
    with pytest.raises(ConfigError, match=message):
        SearchStage(**values)


def test_a_plain_pipeline_run_stops_before_notebook_07():
    from c2llm_lib.notebook import STAGES
    from c2llm_lib.params import select_notebooks

    assert select_notebooks(None) == [n for n in STAGES if n != "07_search_code"] and len(STAGES) == 7
    assert select_notebooks(["07"]) == ["07_search_code"]
    assert select_notebooks(["03", "07"]) == ["03_merge_checkpoints", "07_search_code"]
    with pytest.raises(ConfigError, match="--only \\['08'\\]: choose among 01, 02, 03, 04, 05, 06, 07"):
        select_notebooks(["08"])


@pytest.mark.slow
def test_notebook_07_searches_the_smoke_run_and_reuses_its_index_on_resume(smoke_merged):
    import nbformat

    from c2llm_lib.pipeline import run_pipeline

    smoke = Path(__file__).resolve().parent.parent / "params" / "smoke.yaml"
    shutil.rmtree(smoke_merged / "smoke" / "search", ignore_errors=True)  # an index the browser test may have built
    lines = []
    run = run_pipeline(smoke, only=["07"], mode="resume", outputs=smoke_merged, log=lines.append)
    nb = nbformat.read(run.root / "notebooks" / "07_search_code.ipynb", as_version=4)
    assert nb.metadata.papermill["exception"] is None
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "to encode: " in text and "tokens/s on cpu; the other" in text  # the plan and the estimate
    assert "held-out files of lodash not searched" in text
    metrics = json.loads((run.root / "metrics" / "search.json").read_text())
    assert metrics["index"]["files"] == 3 and metrics["index"]["new_files"] == 3  # smoke.yaml: search_max_files 3
    assert metrics["summary"]["known"] == 5 and all(q["model_rank"] for q in metrics["queries"])
    assert all(q["expected"]["file"].startswith("python/") for q in metrics["queries"])
    page = (run.root / "figures" / "search.html").read_text()
    assert page.count("<table class='c2llm-hits'") == 5 and "rgba(" in page
    first = (run.root / "search" / "index" / "tensors.safetensors").read_bytes()
    lines.clear()
    run_pipeline(smoke, only=["07"], mode="resume", outputs=smoke_merged, log=lines.append)
    assert lines[0] == "[07_search_code] running (the folders it searches lie outside the run) ..."
    again = json.loads((run.root / "metrics" / "search.json").read_text())
    assert again["index"]["reused_files"] == 3 and again["index"]["encoded_documents"] == 0
    assert (run.root / "search" / "index" / "tensors.safetensors").read_bytes() == first


def test_stored_attention_refuses_weights_for_another_tokenisation(encoder):
    from c2llm_lib.attention import pma_attention, stored_attention

    text = "def f(x):\n    return x"
    fresh = pma_attention(encoder, [text], "document", max_tokens=64)[0]
    again = stored_attention(encoder, text, fresh.weights.mean(0), "document", None, 64)
    assert again.tokens == fresh.tokens and again.prefix_tokens == fresh.prefix_tokens
    with pytest.raises(ValueError, match=r"stored_attention: 3 weights for the \d+ tokens this encoder gives"):
        stored_attention(encoder, text, np.ones(3) / 3, "document", None, 64)


def test_an_index_whose_width_differs_from_its_settings_is_refused(encoder, tree, tmp_path):
    run = RunDir.open("r", tmp_path / "outputs")
    index, _ = build(encoder, tree)
    index.embeddings = index.embeddings[:, :8]
    run.save_search_index(index_payload(index))
    with pytest.raises(CorruptFile, match="embeddings of width 8, settings say 64"):
        read_index(run.search_index_dir)


def _crafted(run, index, record_change=None, tensor_change=None):
    """The saved index of `index` with its record or tensors changed as given, well-formed (it reads back)."""
    from safetensors.numpy import load, save

    payload = index_payload(index)
    record, tensors = json.loads(payload["index.json"]), load(payload["tensors.safetensors"])
    (record_change or (lambda r: None))(record)
    (tensor_change or (lambda t: None))(tensors)
    run.save_search_index({"index.json": json.dumps(record).encode(), "tensors.safetensors": save(tensors)})
    return previous_index(run.search_index_dir, lambda line: pytest.fail(f"read as corrupt: {line}"))


def _lines(record):
    record["documents"][0].update(start_line=500, end_line=510)  # lines geometry.py does not have


def _text(record):
    record["documents"][0]["code"] += "\n    # a line the file does not have, a few tokens long"


def _attention(tensors):
    tensors["attention_offsets"][1] -= 3  # three of circle_area's weights counted as the next function's


def _embedding(tensors):
    tensors["embeddings"][1] *= 2


@pytest.mark.parametrize(
    ("record_change", "tensor_change", "said"),
    [
        (_lines, None, "it holds 'circle_area' at lines 500-510, the file has 'circle_area' at lines 4-6"),
        (_text, None, "its text of 'circle_area' at lines 4-6 is not the file's"),
        (None, _attention, "the attention of 'circle_area' is not a distribution over its"),
        (None, _embedding, "an embedding is not a finite unit vector"),
    ],
    ids=["lines", "text", "attention", "embedding"],
)
def test_a_reused_file_whose_index_entries_do_not_match_it_is_encoded_again(
    encoder, tree, tmp_path, record_change, tensor_change, said
):
    """A well-formed index whose entries a file's content digest still vouches for was served as it was: a function
    shown at lines its file does not have, or an attention `stored_attention` refuses on every rerun (a raw
    ValueError until search/ was deleted by hand)."""
    run = RunDir.open("r", tmp_path / "outputs")
    index, _ = build(encoder, tree, save=run.save_search_index)
    crafted = _crafted(run, index, record_change, tensor_change)
    lines = []
    again, report = build(encoder, tree, previous=crafted, log=lines, save=run.save_search_index)
    assert (report.mismatched_files, report.reused_files, report.encoded_documents) == (1, 2, 3)  # geometry.py
    assert f"proj/pkg/geometry.py is unchanged, but the index does not match it ({said}" in "\n".join(report.lines())
    assert "1 not matching the index (encoded again)" in "\n".join(report.lines())
    assert again.documents == index.documents and again.files == index.files
    np.testing.assert_allclose(again.embeddings, index.embeddings, atol=1e-5)
    searcher = Searcher(again, encoder)
    assert "proj/pkg/geometry.py:4-6" in results_page(searcher, [searcher.search("area", 6, -1.0)], "t")  # shaded
    _, report = build(encoder, tree, previous=read_index(run.search_index_dir))  # the rebuilt index was saved
    assert report.mismatched_files == 0 and report.reused_files == 3


def test_an_index_inconsistent_as_a_whole_is_built_again_and_said(encoder, tree, tmp_path):
    """A PMA index without its attention read back, then failed `update_index` with a raw ValueError on every rerun."""
    run = RunDir.open("r", tmp_path / "outputs")
    index, _ = build(encoder, tree, save=run.save_search_index)
    payload = index_payload(index)
    from safetensors.numpy import load, save

    tensors = {"embeddings": load(payload["tensors.safetensors"])["embeddings"]}  # the attention left out
    run.save_search_index({**payload, "tensors.safetensors": save(tensors)})
    with pytest.raises(CorruptFile, match="settings say pooling 'pma', and the index holds no PMA attention"):
        read_index(run.search_index_dir)
    said = []
    assert previous_index(run.search_index_dir, said.append) is None
    assert said[0].startswith("the saved search index cannot be read, so it is built again")
    again, report = build(encoder, tree, previous=None, save=run.save_search_index)
    assert report.new_files == 3 and again.documents == index.documents and len(again.attention) == len(again)
