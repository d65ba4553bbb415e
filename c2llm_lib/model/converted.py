"""The converted copy of a local GGUF backbone (paper section 4.1's base model, as model/gguf.py fetches it):
transformers' GGUF loader dequantises the default's 0.5B model in about 45 s on 2 cores, and a run loads it in
notebooks 02 and 03; the converted base (per dtype) and tokenizer are kept under `downloads.default_cache_dir()`
/converted and read back in about 2 s (benchmarks/gguf_copy_bench.py). See docs/encoder.md.

A copy is keyed by the GGUF's sha256, the converting packages' versions and `CONVERSION_FORMAT` (raised whenever
backbone.py's conversion steps change), and holds the digest of its files, checked before it is read.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.metadata
import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import ModelConfig
from ..downloads import default_cache_dir
from ..files import atomic_directory, file_digest

# what is stored: transformers' save_pretrained of the dequantised base, or of the GGUF's tokenizer (2: with the
# digest of its files)
CONVERSION_FORMAT = 2
CONVERTING_PACKAGES = ("torch", "transformers", "gguf", "numpy", "tokenizers")  # their versions key a copy
DIGEST = ".digest"  # files.file_digest of the copy's files (hidden and cache-* files aside), written last


@functools.lru_cache(maxsize=8)
def _file_sha256(path: str, size: int, mtime_ns: int, ctime_ns: int, inode: int) -> str:
    return file_digest(path)  # once per process and file version: the backbone and the tokenizer share it


def converted_copy(cfg: ModelConfig, part: str) -> Path | None:
    """The cache folder of a local GGUF's `part` as converted: "tokenizer", or the base model in a dtype
    ("bfloat16"); None for any other source."""
    if cfg.gguf_file is None:
        return None
    gguf = Path(cfg.backbone).expanduser() / cfg.gguf_file
    if not gguf.is_file():
        return None  # a GGUF on the hub: transformers' own cache
    stat = gguf.stat()  # a change of content changes the inode or ctime even where size and mtime are kept
    sha256 = _file_sha256(str(gguf.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    versions = {name: importlib.metadata.version(name) for name in CONVERTING_PACKAGES}
    key = hashlib.blake2b(json.dumps([CONVERSION_FORMAT, sha256, versions]).encode(), digest_size=8).hexdigest()
    return default_cache_dir() / "converted" / f"{gguf.stem}-{key}" / part


def _damage(folder: Path) -> str:
    """Why the copy in `folder` is not whole ("" when its files match their digest)."""
    recorded = folder / DIGEST
    if not recorded.is_file():
        return "holds no digest of its files"
    try:
        if file_digest(folder) != recorded.read_text().strip():
            return "no longer matches the digest of its files"
    except (OSError, ValueError) as err:  # an unreadable file, a digest that is not text
        return f"cannot be checked against the digest of its files ({type(err).__name__}: {err})"
    return ""


def _not_stored(folder: Path, err: BaseException) -> None:
    warnings.warn(f"the converted copy could not be stored in {folder} ({type(err).__name__}: {err}): the next load "
                  "converts the GGUF again", stacklevel=4)  # fmt: skip


def through_copy(folder: Path | None, read: Callable[[Path], Any], convert: Callable[[], Any],
                 save: Callable[[Any, Path], None]) -> Any:  # fmt: skip
    """`read(folder)` where a whole copy is stored, else `convert()`, stored by `save(result, staging folder)`. One
    process at a time per copy (a lock file beside it): a launch's other ranks wait, then read what one stored. A
    damaged copy is named and replaced; a cache that cannot be written is named and the result returned."""
    if folder is None:
        return convert()
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = open(folder.parent / f"{folder.name}.lock", "a")  # noqa: SIM115 (held for the whole block below)
    except OSError as err:  # a cache this process cannot write: a whole copy is still read
        if folder.is_dir() and not _damage(folder):
            return read(folder)
        _not_stored(folder, err)
        return convert()
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if this process is killed
            locked = True
        except OSError:  # a file system without locks: processes may convert side by side, each storing whole
            locked = False
        # staging, or a replaced copy set aside, of a process killed mid-store (~1 GB each): only under the lock, which
        # no other process's staging outlives
        for stale in folder.parent.glob(f".{folder.name}.*") if locked else ():
            shutil.rmtree(stale, ignore_errors=True)
        if folder.is_dir():
            problem = _damage(folder)
            if not problem:
                return read(folder)
            warnings.warn(f"the converted copy {folder} {problem}: converting the GGUF again and replacing it",
                          stacklevel=3)  # fmt: skip
        result = convert()
        try:
            with atomic_directory(folder) as staging:
                save(result, staging)
                (staging / DIGEST).write_text(file_digest(staging) + "\n")
        except Exception as err:  # a full disk: safetensors and tokenizers raise plain Exceptions
            _not_stored(folder, err)
        return result
