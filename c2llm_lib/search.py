"""Search a folder of code with a run's model (notebook 07): the use an embedding model is trained for.

C2LLM's embeddings exist for retrieval (paper section 1; section 4.2 scores them by nDCG@10 on code search). This
module turns a run's merged model into a code search over a folder and shows why each hit came back:
- **Documents** are the functions of the folder, documented or not (`code_trees.source_files` and `every_function`:
  the mining's walk, skip rules, .gitignore and languages), each with its file, 1-based first and last line and
  language. A document is the function's code without its documentation (Python docstring, the comment above it),
  as CodeSearchNet's documents and this model's training documents are, so that a query written from the
  documentation is a fair test and the model is judged on the code.
- **The index** holds the documents' unit embeddings (the text->code task's document prompt, `search_max_length`
  tokens) and, for a PMA model, each document's PMA attention (section 3, equation 4's softmax, mean over heads) over
  its tokens, computed in the same forward, so that a hit is shaded at once. `RunDir.save_search_index` writes it to
  `search/index/` as `index.json` (settings, per-file fingerprints, documents) and `tensors.safetensors`
  (embeddings, attention): no pickle. Each file is fingerprinted by size, modification time and the sha256 of its
  content: a file whose content is unchanged is reused (a touched file too), a changed or new file is encoded, a
  file gone from the folder is dropped. A reused file is checked against the index first: each of its functions must
  be the index's (name, lines, text: the file is parsed again, which costs no encoding) and its vectors must fit them
  (finite unit embeddings; for PMA an attention over each function's tokens). A file that does not match is encoded
  again and named in the log, and an index whose structure is inconsistent is built again whole (`previous_index`),
  so that a damaged or hand-edited index never shows a function at lines its file does not have, nor fails every
  rerun. Another model, prompt or length (`index_settings`) encodes everything again. The index is saved every
  minute while it grows, so a killed run keeps what it had encoded.
- **Before encoding** `update_index` says what it will encode (files, functions, tokens counted with the tokenizer,
  how many are cut), measures the model on a short sample of those functions spread over their lengths (the first
  one untimed) and states the time the rest should take at that rate, then shows a progress bar.
  `search_max_files` bounds the files (in the walk's sorted order).
- **A query** (`Searcher.search`) is embedded with the text->code instruction and ranked by cosine against every
  document, beside BM25 (`bm25s`, the scorer of `eval.evaluate_bm25` and the hard-negative miner, over the same
  code) with its scores. Model hits under `search_min_score` (a cosine) are not shown, and a query with none above
  it says so with its best score; BM25 shows only documents sharing a word with the query. On an indexed folder a
  query is one short forward and a product with the embeddings: tested under a second over 3,000 documents.
- **Known answers**: the default queries are held-out queries whose function is in the index, so the rank at which
  the model and BM25 return it is reported. For the offline default run they are the snapshot's held-out text->code
  queries whose file exists in this machine's standard library (lodash, the snapshot's JavaScript source, is not
  installed: said and skipped); for a `data_source: code` run the held-out files of `code_roots` (notebook 01's
  split by a hash of each path) and, as queries, the first paragraphs of their functions' documentation by notebook
  01's text->code recipe (`offline.pair_records`), which are that run's held-out queries; for folders named in
  `search_roots`, the same documentation queries, which may have been trained on.
- **Showing hits**: `result_html` is one query's table of the model's hits beside BM25's, each with its file, lines
  and score and its code shaded by the PMA attention (`figures.attention_spans`, notebook 05's view; a last-token or
  mean model says it has no attention to shade); `results_page` a whole page; `search_widget` an ipywidgets query
  box for JupyterLab.

An empty folder, one with no supported file, a missing or unreadable folder, and a default that has no source files
(`data_source` files or hub) are `DataError`s naming them; unreadable files inside a folder are skipped and counted
with their paths, as mining counts them.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import platform
import sysconfig
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .attention import stored_attention
from .batching import length_batches
from .config import MAX_TOKENS, SearchStage
from .data.code_trees import SourceFile, code_roots, every_function, source_files
from .data.grammars import summary_of
from .data.offline import SNAPSHOT_DIR, TEXT_TO_CODE, load_snapshot, pair_records, split_of
from .data.records import DataError, SkipReport
from .figures import attention_spans
from .files import CorruptFile, fingerprint, load_json, load_tensors
from .prompts import prompts

FORMAT_VERSION = 1
INDEX_FILES = ("index.json", "tensors.safetensors")
PROBE = 16  # functions encoded first, spread over their token lengths, to measure the model's rate
CHUNK = 64  # functions encoded between progress updates (whole files at a time)
SAVE_EVERY = 60.0  # seconds between saves of a growing index


@dataclass
class Document:
    """One indexed function: where it is, and the code the model embedded."""

    file: str  # the root's name and the path inside it, e.g. "python/json/encoder.py"
    function: str
    language: str
    start_line: int  # 1-based, decorators included
    end_line: int
    code: str  # without its documentation
    summary: str = ""  # the first paragraph of its documentation, "" when it has none (a known-answer query)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.start_line}-{self.end_line}"


@dataclass
class FileState:
    """A file's fingerprint when it was indexed: a file is encoded again only when its content hash changes."""

    size: int
    mtime_ns: int
    sha256: str
    documents: int  # functions indexed from it


@dataclass
class SearchIndex:
    settings: dict[str, Any]  # `index_settings`: the model and how documents were encoded
    files: dict[str, FileState]  # file id -> fingerprint, in walk order
    documents: list[Document]
    embeddings: np.ndarray  # (N, d) float32, unit rows
    attention: list[np.ndarray] | None  # per document (T_i,) PMA attention, mean over heads; None: no PMA head

    def __post_init__(self) -> None:
        n = len(self.documents)
        if self.embeddings.ndim != 2 or self.embeddings.shape[0] != n:
            raise ValueError(f"SearchIndex: embeddings {self.embeddings.shape} for {n} documents")
        if self.attention is not None and len(self.attention) != n:
            raise ValueError(f"SearchIndex: attention for {len(self.attention)} of {n} documents")
        listed = [file for file, state in self.files.items() for _ in range(state.documents)]
        if listed != [d.file for d in self.documents]:  # each file's documents together, in the files' order
            raise ValueError(f"SearchIndex: its files list {len(listed)} documents in file order, it holds {n} "
                             "that do not follow them")  # fmt: skip

    def __len__(self) -> int:
        return len(self.documents)


def index_settings(encoder, model_id: str, max_length: int) -> dict[str, Any]:
    """What an index's embeddings depend on besides the files: the model (`model_id`, e.g. `model_identity`), its
    pooler and width, the text->code prompts of its prompt style, and the length documents are cut to."""
    cfg = encoder.config
    query_instruction, document_instruction = prompts(cfg.prompt_style, TEXT_TO_CODE, cfg.document_prefix)
    return {"model": model_id, "pooling": cfg.pooling, "embedding_dim": encoder.embedding_dim,
            "query_instruction": query_instruction, "document_instruction": document_instruction,
            "max_length": max_length}  # fmt: skip


def model_identity(directory: str | os.PathLike) -> str:
    """A digest of a model folder's file names, sizes and modification times (a retrained model differs)."""
    path = Path(directory)
    return f"{path.name}:{fingerprint(path, path.name)}"


# what is searched ---------------------------------------------------------------------------------------------------
@dataclass
class KnownQuery:
    """A query, and the function that answers it when that is known (a held-out pair)."""

    text: str
    file: str | None = None
    function: str | None = None
    start_line: int | None = None  # None: any function of that name in the file (the snapshot records no lines)

    @property
    def known(self) -> bool:
        return self.file is not None

    def matches(self, doc: Document) -> bool:
        return (doc.file == self.file and doc.function == self.function
                and self.start_line in (None, doc.start_line))  # fmt: skip


@dataclass
class Sources:
    """The folders to index, which of their files, and where known-answer queries come from."""

    roots: list[tuple[str, Path]]  # (name starting the file ids, folder)
    keep: Callable[[str], bool] | None  # which file ids to index; None: every file the skip rules keep
    heldout: list[KnownQuery] | None  # the run's held-out queries; None: from the indexed functions' documentation
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"root {name}: {root}" for name, root in self.roots] + self.notes


def _heldout_file(test_percent: int, file: str) -> bool:
    """Whether a file id (`root/path`) is in notebook 01's held-out split of `data_source: code`."""
    return split_of(file.split("/", 1)[1], test_percent) == "test"


def search_sources(stage: SearchStage) -> Sources:
    """What notebook 07 indexes: the folders of `search_roots`, else the run's held-out source files (the offline
    snapshot's in this Python's standard library, or the held-out files of `code_roots`)."""
    if stage.search_roots:
        return Sources(code_roots(stage.search_roots), None, None, [
            "the folders named in search_roots; known-answer queries are the documentation of their functions, "
            "which may have been trained on"])  # fmt: skip
    if stage.data_source == "offline":
        return offline_sources()
    if stage.data_source == "code":
        if not stage.code_roots:
            raise DataError("search_roots is empty and data_source 'code' names no code_roots: name the folders to "
                            "search in search_roots, or the run's code_roots")  # fmt: skip
        pct = stage.code_test_percent
        note = (
            f"the held-out files of code_roots ({pct} % of the files, by a hash of each path, as notebook 01 "
            "split them); known-answer queries are their functions' documentation, notebook 01's held-out queries"
        )
        return Sources(code_roots(stage.code_roots), functools.partial(_heldout_file, pct), None, [note])
    raise DataError(f"search_roots is empty and data_source {stage.data_source!r} holds query-document pairs, not "
                    "source files: name the folders to search in search_roots")  # fmt: skip


def offline_sources(stdlib: str | os.PathLike | None = None) -> Sources:
    """The offline snapshot's held-out Python files, read from this Python's standard library (`stdlib`), with the
    snapshot's held-out text->code queries of those files; held-out files not found there are named and skipped."""
    stdlib = Path(stdlib or sysconfig.get_paths()["stdlib"])
    rows = [r for r in load_snapshot() if r["split"] == "test" and r["dataset"] == TEXT_TO_CODE]
    python = sorted({r["file"] for r in rows if r["file"].startswith("python/")})
    present = {f for f in python if (stdlib / f.removeprefix("python/")).is_file()}
    mined = json.loads((SNAPSHOT_DIR / "manifest.json").read_text())["sources"]["python"].split(" standard")[0]
    notes = [f"{len(present)} of the offline snapshot's {len(python)} held-out Python files, read from this "
             f"Python's standard library ({platform.python_implementation()} {platform.python_version()}; the "
             f"snapshot was mined from {mined})"]  # fmt: skip
    missing = sorted(set(python) - present)
    if missing:
        notes.append(f"not in this standard library, skipped: {', '.join(missing[:5])}"
                     + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))  # fmt: skip
    other = Counter(r["file"].split("/")[1] for r in rows if not r["file"].startswith("python/"))
    notes += [f"{len({r['file'] for r in rows if r['file'].split('/')[1] == name})} held-out files of {name} not "
              f"searched: {name} is not installed here (the snapshot ships its pairs, not its files)"
              for name in sorted(other)]  # fmt: skip
    if not present:
        raise DataError(f"none of the offline snapshot's {len(python)} held-out Python files is in this Python's "
                        f"standard library ({stdlib}): name the folders to search in search_roots")  # fmt: skip
    if not os.access(stdlib, os.R_OK | os.X_OK):
        raise DataError(f"the standard library folder {stdlib} cannot be read")
    heldout = [KnownQuery(r["query"], r["file"], r["function"]) for r in rows if r["file"] in present]
    return Sources([("python", stdlib)], frozenset(present).__contains__, heldout, notes)


# building the index -------------------------------------------------------------------------------------------------
@dataclass
class IndexReport:
    """What `update_index` did: files kept, reused, encoded, dropped or skipped, and the encoding's cost."""

    files: SkipReport = field(default_factory=SkipReport)  # the walk: files kept and skipped by reason, per root
    reused_files: int = 0
    new_files: int = 0
    changed_files: int = 0
    removed_files: int = 0
    mismatched_files: int = 0  # unchanged files whose entries in the index did not match them: encoded again
    beyond_max_files: int = 0
    encoded_documents: int = 0
    encoded_tokens: int = 0
    cut_documents: int = 0  # functions longer than max_length, cut
    probe_tokens_per_s: float | None = None
    estimated_seconds: float | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = self.files.lines() + self.notes
        out.append(
            f"files: {self.reused_files} unchanged (reused), {self.new_files} new, {self.changed_files} "
            f"changed, {self.removed_files} dropped (gone or no longer selected)"
            + (f", {self.mismatched_files} not matching the index (encoded again)" if self.mismatched_files else "")
            + (f", {self.beyond_max_files} left out by search_max_files" if self.beyond_max_files else "")
        )
        rate = f" ({self.encoded_tokens / self.seconds:.0f} tokens/s)" if self.seconds and self.encoded_tokens else ""
        out.append(f"encoded {self.encoded_documents} functions, {self.encoded_tokens} tokens, in "
                   f"{_duration(self.seconds)}{rate}")  # fmt: skip
        return out

    def as_dict(self) -> dict[str, Any]:
        """The counts and times; the walk's skip report is `files.as_dict()`."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "files"}


@dataclass
class _Part:
    """One file's share of the index being built: its documents and, once encoded or reused, their vectors."""

    file: str
    state: FileState
    documents: list[Document]
    embeddings: np.ndarray | None = None  # (n, d)
    attention: list[np.ndarray] | None = None


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    return f"{h} h {rest // 60} min" if h else f"{rest // 60} min {rest % 60} s" if rest >= 60 else f"{rest} s"


def _documents(source: SourceFile, functions) -> list[Document]:
    return [Document(source.file, f.name, source.grammar.language, f.start_line, f.end_line, f.code,
                     summary_of(f.doc, comment=not f.docstring) if f.doc else "")
            for f in functions if f.code.strip()]  # fmt: skip


def _fingerprint(source: SourceFile, documents: int) -> FileState:
    stat = os.stat(source.path, follow_symlinks=False)
    return FileState(stat.st_size, stat.st_mtime_ns, hashlib.sha256(source.data).hexdigest(), documents)


def _previous_parts(previous: SearchIndex | None) -> dict[str, _Part]:
    """{file: its part} of an earlier index, vectors included."""
    if previous is None:
        return {}
    parts: dict[str, _Part] = {}
    start = 0
    for file, state in previous.files.items():
        stop = start + state.documents
        attention = previous.attention[start:stop] if previous.attention is not None else None
        parts[file] = _Part(file, state, previous.documents[start:stop], previous.embeddings[start:stop], attention)
        start = stop
    return parts


def _scan(sources: Sources, earlier: dict[str, _Part], max_files: int | None, report: IndexReport) -> list[_Part]:
    """The index's files in walk order: earlier parts that match their file now (its content digest, and every
    function at the lines and with the text the file gives it, `_mismatch`), the others parsed into documents still to
    encode. Counts reused, new, changed, mismatched and left-out files; files that do not parse are skipped."""
    parts: list[_Part] = []
    for source in source_files(sources.roots, report.files, keep=sources.keep):
        if max_files is not None and len(parts) >= max_files:
            report.beyond_max_files += 1
            continue
        old = earlier.get(source.file)
        functions = every_function(source, report.files)
        if functions is None:
            continue
        documents = _documents(source, functions)
        state = _fingerprint(source, len(documents))
        if old is not None and old.state.sha256 == state.sha256:
            problem = _mismatch(old.documents, documents)
            if problem is None:
                report.reused_files += 1
                old.state = state
                parts.append(old)
                continue
            report.mismatched_files += 1
            report.notes.append(f"{source.file} is unchanged, but the index does not match it ({problem}): encoded "
                                "again")  # fmt: skip
        else:
            report.changed_files += old is not None
            report.new_files += old is None
        parts.append(_Part(source.file, state, documents))
    report.removed_files = len(set(earlier) - {p.file for p in parts})
    return parts


def _mismatch(recorded: list[Document], found: list[Document]) -> str | None:
    """How an index's documents of a file differ from the file's functions now (None: they do not): functions the file
    does not have, at other lines, or with another text."""
    if recorded == found:
        return None
    if len(recorded) != len(found):
        return f"it holds {len(recorded)} functions of the file, the file has {len(found)}"
    old, new = next((r, f) for r, f in zip(recorded, found, strict=True) if r != f)
    if (old.function, old.start_line, old.end_line) != (new.function, new.start_line, new.end_line):
        return (f"it holds {old.function!r} at lines {old.start_line}-{old.end_line}, the file has {new.function!r} at "
                f"lines {new.start_line}-{new.end_line}")  # fmt: skip
    return f"its text of {old.function!r} at lines {old.start_line}-{old.end_line} is not the file's"


def _vector_mismatch(encoder, part: _Part, settings: dict[str, Any]) -> str | None:
    """How a reused part's vectors fail its documents (None: they do not): an embedding that is not a finite unit
    row, or, for a PMA model, an attention that is not one finite distribution over the tokens the model gives each
    document (`stored_attention` would refuse it when the hit is shown)."""
    norms = np.linalg.norm(part.embeddings, axis=1) if len(part.documents) else np.ones(0)
    if not np.isfinite(part.embeddings).all() or not np.allclose(norms, 1.0, atol=1e-3):
        return "an embedding is not a finite unit vector"
    if encoder.config.pooling != "pma" or not part.documents:
        return None
    if part.attention is None or len(part.attention) != len(part.documents):
        return "it holds no PMA attention for every function"
    texts = encoder.format_texts([d.code for d in part.documents], "document", settings["document_instruction"])
    lengths = encoder.token_lengths(texts, settings["max_length"])
    for doc, weights, n in zip(part.documents, part.attention, lengths, strict=True):
        if len(weights) != n or not np.isfinite(weights).all() or abs(float(weights.sum()) - 1) > 1e-3:
            return f"the attention of {doc.function!r} is not a distribution over its {n} tokens"
    return None


def _encode(encoder, texts: Sequence[str], instruction: str, max_length: int, batch_size: int):
    """(unit embeddings (n, d), each text's PMA attention (T_i,) averaged over heads, or None without a PMA head).
    The batches and prompts are `C2LLMEncoder.encode`'s, so the embeddings equal its (padding changes none)."""
    if encoder.config.pooling != "pma":
        vectors = encoder.encode(list(texts), kind="document", instruction=instruction, max_length=max_length,
                                 batch_size=batch_size, show_progress=False)  # fmt: skip
        return vectors, None
    formatted = encoder.format_texts(texts, "document", instruction)
    lengths = encoder.token_lengths(formatted, max_length)
    vectors = np.empty((len(texts), encoder.embedding_dim), dtype=np.float32)  # (n, d)
    attention: list[Any] = [None] * len(texts)
    was_training = encoder.training
    encoder.eval()
    try:
        with torch.inference_mode():
            for idx in length_batches(lengths, batch_size, fill=encoder.device.type != "cpu"):
                batch = encoder.tokenize_formatted([formatted[i] for i in idx], max_length)
                emb, attn = encoder(**batch, return_attention=True)  # (b, d), (b, H, T)
                vectors[idx] = F.normalize(emb, dim=-1).float().cpu().numpy()
                mean = attn.float().mean(1).cpu()  # (b, T)
                real = batch["attention_mask"].bool()  # (b, T)
                for row, i in enumerate(idx):
                    attention[i] = mean[row][real[row]].numpy()  # (T_i,)
    finally:
        encoder.train(was_training)
    return vectors, attention


def _assemble(settings: dict[str, Any], parts: list[_Part], dim: int, pma: bool) -> SearchIndex:
    """The index of the parts that have vectors, in walk order."""
    done = [p for p in parts if p.embeddings is not None]
    embeddings = np.concatenate([p.embeddings for p in done]) if done else np.zeros((0, dim), np.float32)
    attention = [a for p in done for a in (p.attention or [])] if pma else None
    return SearchIndex(dict(settings), {p.file: p.state for p in done}, [d for p in done for d in p.documents],
                       embeddings.astype(np.float32), attention)  # fmt: skip


def update_index(
    encoder,
    sources: Sources,
    previous: SearchIndex | None,
    settings: dict[str, Any],
    *,
    max_files: int | None = None,
    batch_size: int = 16,
    save: Callable[[dict[str, bytes]], Any] | None = None,
    save_every: float = SAVE_EVERY,
    log: Callable[[str], Any] = print,
) -> tuple[SearchIndex, IndexReport]:
    """The index of `sources` for `encoder` (`settings` from `index_settings`), reusing `previous` for files whose
    content is unchanged. Says what it will encode and how long that should take (measured on a sample first), shows a
    progress bar, and hands the index to `save` (e.g. `RunDir.save_search_index`) every `save_every` seconds and at
    the end. A folder with no function to index is a `DataError` naming it."""
    report = IndexReport()
    reusable = previous is not None and previous.settings == settings
    if previous is not None and not reusable:
        changed = sorted(k for k in {*settings, *previous.settings} if settings.get(k) != previous.settings.get(k))
        report.notes.append(f"the index was built with other settings ({', '.join(changed)}): every file is encoded "
                            "again")  # fmt: skip
    parts = _scan(sources, _previous_parts(previous if reusable else None), max_files, report)
    if not any(p.documents for p in parts):
        where = ", ".join(str(root) for _, root in sources.roots)
        raise DataError(f"no function to index in {len(parts)} files under {where}; skipped: "
                        f"{'; '.join(report.files.lines()) or 'nothing'}")  # fmt: skip
    pma, dim = encoder.config.pooling == "pma", encoder.embedding_dim
    for part in parts:
        problem = _vector_mismatch(encoder, part, settings) if part.embeddings is not None else None
        if problem is not None:  # the file matches, its vectors do not: encoded again
            part.embeddings = part.attention = None
            report.reused_files -= 1
            report.mismatched_files += 1
            report.notes.append(f"{part.file} is unchanged, but the index does not match it ({problem}): encoded "
                                "again")  # fmt: skip
        if not part.documents and part.embeddings is None:  # a file without functions: indexed, nothing to encode
            part.embeddings, part.attention = np.zeros((0, dim), np.float32), [] if pma else None
    pending = [(p, j) for p in parts if p.embeddings is None for j in range(len(p.documents))]
    start = time.perf_counter()
    if pending:
        checkpoint = None if save is None else functools.partial(_save_partial, save, settings, parts, dim, pma)
        _encode_pending(encoder, pending, settings, batch_size, report, log, checkpoint, save_every)
    else:
        log(f"nothing to encode: {len(parts)} files unchanged since the index was built")
    report.seconds = time.perf_counter() - start
    index = _assemble(settings, parts, dim, pma)
    if save is not None:
        save(index_payload(index))
    return index, report


def _save_partial(save, settings, parts, dim, pma) -> None:
    save(index_payload(_assemble(settings, parts, dim, pma)))


def _encode_pending(encoder, pending, settings, batch_size, report, log, checkpoint, save_every) -> None:
    """Encodes the documents still without vectors: a plan, a measured sample, then the rest, whole files at a time
    (a file gets its vectors when all its functions have theirs)."""
    from tqdm.auto import tqdm

    instruction, max_length = settings["document_instruction"], settings["max_length"]
    texts = [p.documents[j].code for p, j in pending]
    full = encoder.token_lengths(encoder.format_texts(texts, "document", instruction), MAX_TOKENS)
    lengths = [min(n, max_length) for n in full]
    report.cut_documents = sum(n > max_length for n in full)
    report.encoded_documents, report.encoded_tokens = len(texts), sum(lengths)
    files = len({id(p) for p, _ in pending})
    log(f"to encode: {len(texts)} functions of {files} files, {sum(lengths):,} tokens ({report.cut_documents} "
        f"functions cut to {max_length} tokens); reused: {report.reused_files} unchanged files")  # fmt: skip
    vectors: list[Any] = [None] * len(texts)
    attention: list[Any] = [None] * len(texts)
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    probe = order[:: max(1, len(order) // PROBE)][:PROBE]  # spread over the token lengths
    warm, timed = (probe[:1], probe[1:]) if len(probe) > 1 else ([], probe)
    _store(encoder, warm, texts, instruction, max_length, batch_size, vectors, attention)  # first-call costs, untimed
    tick = time.perf_counter()
    _store(encoder, timed, texts, instruction, max_length, batch_size, vectors, attention)
    rate = sum(lengths[i] for i in timed) / max(time.perf_counter() - tick, 1e-9)
    probe_tokens = sum(lengths[i] for i in probe)
    rest = sum(lengths) - probe_tokens
    report.probe_tokens_per_s, report.estimated_seconds = rate, rest / rate
    then = f"the other {rest:,} tokens should take about {_duration(rest / rate)}" if rest else "that was all of them"
    log(f"measured on {len(probe)} of them ({probe_tokens:,} tokens): {rate:,.0f} tokens/s on {encoder.device.type}; "
        f"{then}")  # fmt: skip
    last_save = time.perf_counter()
    with tqdm(total=sum(lengths), initial=probe_tokens, unit="tok", desc="encode functions") as bar:
        position = 0
        while position < len(pending):
            chunk = []
            while position < len(pending) and (len(chunk) < CHUNK or pending[position][1] != 0):
                chunk.append(position)  # whole files: a chunk ends where a file starts
                position += 1
            todo = [i for i in chunk if vectors[i] is None]
            _store(encoder, todo, texts, instruction, max_length, batch_size, vectors, attention)
            bar.update(sum(lengths[i] for i in todo))
            _fill(pending, chunk, vectors, attention, encoder.config.pooling == "pma")
            if checkpoint is not None and time.perf_counter() - last_save >= save_every and position < len(pending):
                checkpoint()  # a killed run keeps the files encoded so far
                last_save = time.perf_counter()


def _store(encoder, indices, texts, instruction, max_length, batch_size, vectors, attention) -> None:
    if not indices:
        return
    emb, attn = _encode(encoder, [texts[i] for i in indices], instruction, max_length, batch_size)
    for row, i in enumerate(indices):
        vectors[i] = emb[row]
        attention[i] = attn[row] if attn is not None else None


def _fill(pending, chunk, vectors, attention, pma: bool) -> None:
    """Gives each file whose documents are all encoded its vectors."""
    for part in {id(pending[i][0]): pending[i][0] for i in chunk}.values():
        rows = [i for i in chunk if pending[i][0] is part]
        if len(rows) == len(part.documents) and all(vectors[i] is not None for i in rows):
            part.embeddings = np.stack([vectors[i] for i in rows]).astype(np.float32)  # (n, d)
            part.attention = [attention[i] for i in rows] if pma else None


# saving and reading -------------------------------------------------------------------------------------------------
def index_payload(index: SearchIndex) -> dict[str, bytes]:
    """The files of `search/index/` (`RunDir.save_search_index` writes them): JSON and safetensors, no pickle."""
    from safetensors.numpy import save

    record = {"format_version": FORMAT_VERSION, "settings": index.settings,
              "files": {f: asdict(s) for f, s in index.files.items()},
              "documents": [asdict(d) for d in index.documents]}  # fmt: skip
    tensors = {"embeddings": np.ascontiguousarray(index.embeddings, dtype=np.float32)}  # (N, d)
    if index.attention is not None:
        lengths = [len(a) for a in index.attention]
        tensors["attention"] = np.concatenate([np.zeros(0, np.float32), *index.attention]).astype(np.float32)
        tensors["attention_offsets"] = np.cumsum([0, *lengths]).astype(np.int64)  # (N + 1,)
    return {"index.json": json.dumps(record, ensure_ascii=False).encode(), "tensors.safetensors": save(tensors)}


def read_index(folder: str | os.PathLike) -> SearchIndex | None:
    """The index saved in `folder`, or None when there is none; a truncated, corrupt or inconsistent index is a
    `CorruptFile` naming the file and what is wrong."""
    folder = Path(folder)
    if not folder.exists():
        return None
    record_path, tensors_path = (folder / name for name in INDEX_FILES)
    record = load_json(record_path, "search index")
    if record.get("format_version") != FORMAT_VERSION:
        raise CorruptFile(f"{record_path}: format_version {record.get('format_version')!r} is not {FORMAT_VERSION}")
    tensors = {k: v.numpy() for k, v in load_tensors(tensors_path, "search index vectors").items()}
    try:
        documents = [Document(**d) for d in record["documents"]]
        files = {f: FileState(**s) for f, s in record["files"].items()}
        attention = None
        if "attention" in tensors:
            offsets, flat = tensors["attention_offsets"], tensors["attention"]
            if len(offsets) != len(documents) + 1 or offsets[-1] != len(flat) or (np.diff(offsets) < 0).any():
                raise ValueError(f"attention offsets {offsets.shape} do not fit {len(documents)} documents")
            attention = [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        index = SearchIndex(record["settings"], files, documents, tensors["embeddings"], attention)
        if index.embeddings.shape[1] != index.settings["embedding_dim"]:
            raise ValueError(f"embeddings of width {index.embeddings.shape[1]}, settings say "
                             f"{index.settings['embedding_dim']}")  # fmt: skip
        if (attention is not None) != (index.settings["pooling"] == "pma"):
            raise ValueError(f"settings say pooling {index.settings['pooling']!r}, and the index holds "
                             f"{'a' if attention is not None else 'no'} PMA attention")  # fmt: skip
        return index
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise CorruptFile(f"{folder}: the search index is inconsistent ({type(err).__name__}: {err})") from None


def previous_index(folder: str | os.PathLike, log: Callable[[str], Any] = print) -> SearchIndex | None:
    """The saved index to update, or None: none yet, or one that cannot be read (said, then built again)."""
    try:
        return read_index(folder)
    except (CorruptFile, FileNotFoundError) as err:
        log(f"the saved search index cannot be read, so it is built again: {err}")
        return None


# searching ----------------------------------------------------------------------------------------------------------
@dataclass
class Hit:
    index: int  # the document's row in the index
    score: float  # cosine for the model, BM25's score for BM25


@dataclass
class SearchResult:
    query: KnownQuery
    model: list[Hit]  # at or above the threshold, best first, at most k
    bm25: list[Hit]  # sharing a word with the query, best first, at most k
    best: Hit  # the model's best hit, shown or not (how far under the threshold a query with no hit is)
    min_score: float
    model_rank: int | None = None  # where the expected function came back (1 = first); None: not known
    bm25_rank: int | None = None  # None also when BM25 scores it 0 (no shared word)
    model_seconds: float = 0.0  # the query's embedding and the ranking
    bm25_seconds: float = 0.0


class Searcher:
    """Queries against an index with its model and BM25; the BM25 index is built once, here, over the same code."""

    def __init__(self, index: SearchIndex, encoder) -> None:
        import bm25s

        expected = {k: v for k, v in index.settings.items() if k in ("pooling", "embedding_dim")}
        found = {"pooling": encoder.config.pooling, "embedding_dim": encoder.embedding_dim}
        if expected != found:
            raise ValueError(f"the index was built by a model with {expected}, this one has {found}: update the index "
                             "with this model (update_index)")  # fmt: skip
        if not len(index):
            raise ValueError("the index holds no function to search")
        self.index, self.encoder = index, encoder
        self.bm25 = bm25s.BM25()
        self.bm25.index(bm25s.tokenize([d.code for d in index.documents], stopwords=None, show_progress=False),
                        show_progress=False)  # fmt: skip
        self._shaded: dict[int, Any] = {}

    def search(self, query: str | KnownQuery, k: int = 5, min_score: float = 0.0) -> SearchResult:
        """The model's top `k` at or above `min_score` and BM25's top `k`, with the ranks of the expected function."""
        import bm25s

        query = query if isinstance(query, KnownQuery) else KnownQuery(query)
        if not isinstance(query.text, str) or not query.text.strip():
            raise ValueError(f"a query must be a non-empty text, got {query.text!r}")
        settings = self.index.settings
        tick = time.perf_counter()
        q = self.encoder.encode(
            [query.text],
            kind="query",
            instruction=settings["query_instruction"],
            max_length=settings["max_length"],
            show_progress=False,
        )[0]  # (d,)
        scores = self.index.embeddings @ q  # (N,) cosines
        model = _top(scores, k)
        model_seconds = time.perf_counter() - tick
        tick = time.perf_counter()
        words = bm25s.tokenize([query.text], stopwords=None, show_progress=False, return_ids=False)[0]
        lexical = self.bm25.get_scores(words) if words else np.zeros(len(self.index))  # (N,)
        bm25 = [h for h in _top(lexical, k) if h.score > 0]
        bm25_seconds = time.perf_counter() - tick
        result = SearchResult(query, [h for h in model if h.score >= min_score], bm25, model[0], min_score,
                              model_seconds=model_seconds, bm25_seconds=bm25_seconds)  # fmt: skip
        expected = [i for i, d in enumerate(self.index.documents) if query.known and query.matches(d)]
        if expected:
            best = max(expected, key=lambda i: scores[i])
            result.model_rank = 1 + int((scores > scores[best]).sum())
            best = max(expected, key=lambda i: lexical[i])
            result.bm25_rank = 1 + int((lexical > lexical[best]).sum()) if lexical[best] > 0 else None
        return result

    def shaded(self, row: int):
        """The document's tokens with their stored PMA attention (`attention.TokenAttention`), or None without PMA."""
        if self.index.attention is None:
            return None
        if row not in self._shaded:
            doc, settings = self.index.documents[row], self.index.settings
            self._shaded[row] = stored_attention(self.encoder, doc.code, self.index.attention[row], "document",
                                                 settings["document_instruction"], settings["max_length"])  # fmt: skip
        return self._shaded[row]


def _top(scores: np.ndarray, k: int) -> list[Hit]:
    """The k best rows, best first (ties in row order)."""
    k = min(k, len(scores))
    rows = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    rows = sorted(rows.tolist(), key=lambda i: (-scores[i], i))
    return [Hit(int(i), float(scores[i])) for i in rows]


def documented_queries(index: SearchIndex) -> list[KnownQuery]:
    """Known-answer queries from the indexed functions' documentation, by notebook 01's text->code recipe: the first
    paragraph of the documentation (3 to 120 words) of a function of 2 to 150 lines (`offline.pair_records`)."""
    out = []
    for d in index.documents:
        rows = pair_records(d.file, d.function, d.language, d.summary, d.code) if d.summary else []
        if any(r["dataset"] == TEXT_TO_CODE for r in rows):
            out.append(KnownQuery(d.summary, d.file, d.function, d.start_line))
    return out


def pick_queries(stage: SearchStage, sources: Sources, index: SearchIndex) -> list[KnownQuery]:
    """`search_queries` as given (answers unknown), or `search_query_count` known-answer queries whose function is
    indexed exactly once, chosen by a hash of their text (the same on every run)."""
    if stage.search_queries:
        return [KnownQuery(q) for q in stage.search_queries]
    candidates = sources.heldout if sources.heldout is not None else documented_queries(index)
    named: dict[tuple[str, str], list[Document]] = {}
    for d in index.documents:
        named.setdefault((d.file, d.function), []).append(d)
    unique = [q for q in candidates if q.known and sum(map(q.matches, named.get((q.file, q.function), []))) == 1]
    if not unique:
        raise DataError(f"none of the {len(candidates)} known-answer queries has its function among the "
                        f"{len(index.files)} files indexed: raise search_max_files or give search_queries")  # fmt: skip
    unique.sort(key=lambda q: hashlib.sha256(q.text.encode()).hexdigest())
    return unique[: stage.search_query_count]


# showing hits -------------------------------------------------------------------------------------------------------
CELL = "vertical-align:top;padding:4px 8px;border-top:1px solid #ccc;width:50%;text-align:left"
CODE = "font-size:12px;line-height:1.5;max-height:18em;overflow:auto;margin:2px 0;white-space:pre"


def _hit_html(searcher: Searcher, hit: Hit, rank: int, query: KnownQuery, what: str) -> str:
    import html

    doc = searcher.index.documents[hit.index]
    mark = " <b style='color:#1a7f37'>&#10003; the expected function</b>" if query.known and query.matches(doc) else ""
    head = (f"<div class='c2llm-hit'>{rank}. <code>{html.escape(doc.where)}</code> <b>{html.escape(doc.function)}</b>"
            f" <span style='color:#555'>{what} {hit.score:.3f}</span>{mark}</div>")  # fmt: skip
    item = searcher.shaded(hit.index)
    if item is None:
        return head + f"<pre style='{CODE}'>{html.escape(doc.code)}</pre>"

    return head + attention_spans(item, CODE)


def result_html(searcher: Searcher, result: SearchResult) -> str:
    """One query's hits: the model's beside BM25's, with files, lines, scores, and the code shaded by PMA attention."""
    import html

    query = result.query
    lines = [f"<h4>{html.escape(query.text)}</h4>"]
    if query.known:
        ranks = (f"the model returns it at rank {result.model_rank}, BM25 at "
                 f"{result.bm25_rank if result.bm25_rank is not None else 'none (no shared word)'}")  # fmt: skip
        lines.append(f"<p>Expected: <code>{html.escape(query.file)}</code> <b>{html.escape(query.function)}</b>: "
                     f"{ranks}.</p>")  # fmt: skip
    if searcher.index.attention is None:
        lines.append(f"<p>This model pools by {searcher.encoder.config.pooling!r}: it has no attention to shade.</p>")
    model = [_hit_html(searcher, h, i + 1, query, "cosine") for i, h in enumerate(result.model)]
    if not model:
        best = searcher.index.documents[result.best.index]
        model = [f"<p class='c2llm-no-hit'>No hit scores above search_min_score = {result.min_score:g} (the best: "
                 f"{result.best.score:.3f}, <code>{html.escape(best.where)}</code>).</p>"]  # fmt: skip
    bm25 = [_hit_html(searcher, h, i + 1, query, "BM25") for i, h in enumerate(result.bm25)]
    bm25 = bm25 or ["<p class='c2llm-no-hit'>No indexed function shares a word with the query.</p>"]
    rows = "".join(f"<tr><td style='{CELL}'>{a}</td><td style='{CELL}'>{b}</td></tr>"
                   for a, b in itertools.zip_longest(model, bm25, fillvalue=""))  # fmt: skip
    timing = f"model {result.model_seconds * 1000:.0f} ms, BM25 {result.bm25_seconds * 1000:.0f} ms"
    table = "border-collapse:collapse;width:100%;table-layout:fixed"  # two equal columns, long lines scroll
    return ("".join(lines) + f"<table class='c2llm-hits' style='{table}'><tr>"
            f"<th style='{CELL}'>this run's model (cosine)</th><th style='{CELL}'>BM25</th></tr>{rows}</table>"
            f"<p style='color:#555'>{timing}</p>")  # fmt: skip


LEGEND = ("Each hit's code is shaded by the PMA head's attention over its tokens (mean over heads, relative to "
          "uniform: none = uniform, red = more, blue = less; paper section 3), the view of notebook 05. Hover a token "
          "for its weight.")  # fmt: skip


def results_page(searcher: Searcher, results: Sequence[SearchResult], title: str) -> str:
    """A whole HTML page of every query's hits."""
    import html

    body = "".join(result_html(searcher, r) for r in results)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
            f"<h3>{html.escape(title)}</h3><p>{html.escape(LEGEND)}</p>{body}</body></html>")  # fmt: skip


def results_frame(searcher: Searcher, results: Sequence[SearchResult]):
    """One row per query: the expected function, the rank each ranker gave it, the top hits and the time."""
    import pandas as pd

    docs = searcher.index.documents
    return pd.DataFrame([{
        "query": r.query.text[:60], "expected": f"{r.query.file} {r.query.function}" if r.query.known else "",
        "model rank": r.model_rank, "BM25 rank": r.bm25_rank,
        "model's first hit": docs[r.model[0].index].function if r.model else "(none above the threshold)",
        "BM25's first hit": docs[r.bm25[0].index].function if r.bm25 else "(no shared word)",
        "model ms": round(r.model_seconds * 1000),
    } for r in results]).astype({"model rank": "Int64", "BM25 rank": "Int64"})  # fmt: skip


def search_metrics(index: SearchIndex, report: IndexReport, results: Sequence[SearchResult], sources: Sources,
                   searcher: Searcher) -> dict[str, Any]:  # fmt: skip
    """What `metrics/search.json` records: the index, each query's hits and ranks, and a summary over known ones."""
    docs = index.documents

    def hits(found: list[Hit]) -> list[dict[str, Any]]:
        return [{"file": docs[h.index].file, "function": docs[h.index].function, "start_line": docs[h.index].start_line,
                 "end_line": docs[h.index].end_line, "score": round(h.score, 4)} for h in found]  # fmt: skip

    known = [r for r in results if r.query.known]
    summary = {"queries": len(results), "known": len(known)}
    for name in ("model", "bm25"):
        ranks = [getattr(r, f"{name}_rank") for r in known]
        summary[f"{name}_top1"] = sum(r == 1 for r in ranks)
        summary[f"{name}_mrr"] = round(sum(1 / r for r in ranks if r) / len(ranks), 4) if ranks else None
    summary["median_model_seconds"] = float(np.median([r.model_seconds for r in results])) if results else None
    return {
        "settings": index.settings, "sources": sources.lines(), "index": {
            **report.as_dict(), "walk": report.files.as_dict(), "files": len(index.files), "documents": len(index)},
        "queries": [{"query": r.query.text, "expected": {"file": r.query.file, "function": r.query.function}
                     if r.query.known else None, "model_rank": r.model_rank, "bm25_rank": r.bm25_rank,
                     "model_hits": hits(r.model), "bm25_hits": hits(r.bm25), "best_score": round(r.best.score, 4),
                     "model_seconds": round(r.model_seconds, 4), "bm25_seconds": round(r.bm25_seconds, 4)}
                    for r in results],
        "summary": summary,
    }  # fmt: skip


def search_widget(searcher: Searcher, k: int = 5, min_score: float = 0.0):
    """A query box for JupyterLab (ipywidgets): type a query and press Enter or Search; the hits table appears below,
    and an error (an empty query, say) is shown in its place."""
    import html

    import ipywidgets as widgets

    box = widgets.Text(placeholder="describe the function you are looking for", description="Query:",
                       continuous_update=False, layout=widgets.Layout(width="70%"))  # fmt: skip
    button = widgets.Button(description="Search", button_style="primary")
    out = widgets.HTML(value="<p style='color:#555'>Type a query and press Enter.</p>")
    shown = {"query": None}

    def run(_: Any = None) -> None:
        query = box.value.strip()
        if query == shown["query"]:
            return
        shown["query"] = query
        try:
            out.value = result_html(searcher, searcher.search(query, k, min_score))
        except Exception as err:  # a widget callback's exception would only reach the log console
            out.value = f"<p style='color:crimson'>{html.escape(f'{type(err).__name__}: {err}')}</p>"

    def again(_: Any) -> None:
        shown["query"] = None
        run()

    box.observe(run, names="value")
    button.on_click(again)
    out.add_class("c2llm-search-hits")  # for a page's scripts and tests to find the hits
    return widgets.VBox([widgets.HBox([box, button]), out])
