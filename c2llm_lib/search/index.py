"""Notebook 07's index (paper section 3's embeddings and PMA attention): a folder's functions encoded, saved without
pickle, updated for changed files, and checked against its files (docs/search.md)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..batching import length_batches
from ..config import MAX_TOKENS
from ..data.code_trees import every_function
from ..data.grammars import summary_of
from ..data.offline import TEXT_TO_CODE
from ..data.records import DataError, SkipReport
from ..data.tree_walk import SourceFile, source_files
from ..files import CorruptFile, fingerprint, load_json, load_tensors
from ..prompts import prompts
from .sources import Document, Sources

FORMAT_VERSION = 1
INDEX_FILES = ("index.json", "tensors.safetensors")
PROBE = 16  # functions encoded first, spread over their token lengths, to measure the model's rate
CHUNK = 64  # functions encoded between progress updates (whole files at a time)
SAVE_EVERY = 60.0  # seconds between saves of a growing index


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


def index_settings(encoder, model: str | os.PathLike, max_length: int) -> dict[str, Any]:
    """What an index's embeddings depend on besides the files: model, pooler, width, prompts, length."""
    cfg, path = encoder.config, Path(model)
    query_instruction, document_instruction = prompts(cfg.prompt_style, TEXT_TO_CODE, cfg.document_prefix)
    return {"model": f"{path.name}:{fingerprint(path, path.name)}" if path.is_dir() else str(model),
            "pooling": cfg.pooling, "embedding_dim": encoder.embedding_dim, "query_instruction": query_instruction,
            "document_instruction": document_instruction, "max_length": max_length}  # fmt: skip


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


def _previous_parts(previous: SearchIndex) -> dict[str, _Part]:
    parts: dict[str, _Part] = {}
    start = 0
    for file, state in previous.files.items():
        stop = start + state.documents
        attention = previous.attention[start:stop] if previous.attention is not None else None
        parts[file] = _Part(file, state, previous.documents[start:stop], previous.embeddings[start:stop], attention)
        start = stop
    return parts


def _scan(encoder, sources: Sources, earlier: dict[str, _Part], settings: dict[str, Any], max_files: int | None,
          report: IndexReport) -> list[_Part]:  # fmt: skip
    """The index's files in walk order: matching earlier parts, others parsed into documents to encode."""
    pma, dim = encoder.config.pooling == "pma", encoder.embedding_dim
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
        stat = os.stat(source.path, follow_symlinks=False)
        state = FileState(stat.st_size, stat.st_mtime_ns, hashlib.sha256(source.data).hexdigest(), len(documents))
        if old is not None and old.state.sha256 == state.sha256:
            problem = _mismatch(old.documents, documents) or _vector_mismatch(encoder, old, settings)
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
        if not documents:  # a file without functions: indexed, nothing to encode
            parts[-1].embeddings, parts[-1].attention = np.zeros((0, dim), np.float32), [] if pma else None
    report.removed_files = len(set(earlier) - {p.file for p in parts})
    return parts


def _mismatch(recorded: list[Document], found: list[Document]) -> str | None:
    """How an index's documents of a file differ from its functions now (None: they do not): count, lines or text."""
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
    """Why a reused part's vectors fail (None: they do not): non-unit embedding or bad attention."""
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
    """(unit embeddings (n, d), PMA attention (T_i,) per text or None), as `C2LLMEncoder.encode` encodes."""
    pma = encoder.config.pooling == "pma"
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
                emb, attn = encoder(**batch, return_attention=True) if pma else (encoder(**batch), None)  # (b, d)
                vectors[idx] = F.normalize(emb, dim=-1).float().cpu().numpy()
                if not pma:
                    continue
                mean = attn.float().mean(1).cpu()  # (b, H, T) -> (b, T)
                real = batch["attention_mask"].bool()  # (b, T)
                for row, i in enumerate(idx):
                    attention[i] = mean[row][real[row]].numpy()  # (T_i,)
    finally:
        encoder.train(was_training)
    return vectors, attention if pma else None


def _assemble(settings: dict[str, Any], parts: list[_Part], dim: int, pma: bool) -> SearchIndex:
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
    """The index of `sources` for `encoder`, reusing `previous` where files still match, saved through `save` every
    `save_every` seconds and at the end; no function is a `DataError`."""
    report = IndexReport()
    reusable = previous is not None and previous.settings == settings
    if previous is not None and not reusable:
        changed = sorted(k for k in {*settings, *previous.settings} if settings.get(k) != previous.settings.get(k))
        report.notes.append(f"the index was built with other settings ({', '.join(changed)}): every file is encoded "
                            "again")  # fmt: skip
    parts = _scan(encoder, sources, _previous_parts(previous) if reusable else {}, settings, max_files, report)
    if not any(p.documents for p in parts):
        where = ", ".join(str(root) for _, root in sources.roots)
        raise DataError(f"no function to index in {len(parts)} files under {where}; skipped: "
                        f"{'; '.join(report.files.lines()) or 'nothing'}")  # fmt: skip
    pma, dim = encoder.config.pooling == "pma", encoder.embedding_dim
    pending = [(p, j) for p in parts if p.embeddings is None for j in range(len(p.documents))]
    start = time.perf_counter()
    if pending:
        checkpoint = None if save is None else lambda: save(index_payload(_assemble(settings, parts, dim, pma)))
        _encode_pending(encoder, pending, settings, batch_size, report, log, checkpoint, save_every)
    else:
        log(f"nothing to encode: {len(parts)} files unchanged since the index was built")
    report.seconds = time.perf_counter() - start
    index = _assemble(settings, parts, dim, pma)
    if save is not None:
        save(index_payload(index))
    return index, report


def _encode_pending(encoder, pending, settings, batch_size, report, log, checkpoint, save_every) -> None:
    """Encodes the documents without vectors: the plan, a measured sample, then the rest, whole files at a time."""
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
    for part in {id(pending[i][0]): pending[i][0] for i in chunk}.values():
        rows = [i for i in chunk if pending[i][0] is part]
        if len(rows) == len(part.documents) and all(vectors[i] is not None for i in rows):
            part.embeddings = np.stack([vectors[i] for i in rows]).astype(np.float32)  # (n, d)
            part.attention = [attention[i] for i in rows] if pma else None


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
    """The index saved in `folder`, or None; a truncated, corrupt or inconsistent one is a `CorruptFile` saying why."""
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
