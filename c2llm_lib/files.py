"""Reading the files a run or a model directory holds, with errors that name the file and what is wrong; and writing a
directory all at once.

Weights are read from safetensors only: a safetensors file holds tensors and nothing that runs, while a
PyTorch `.bin` or `.pt` file is a pickle that can execute code when it is loaded. Such a file is refused unread,
named, also where it lies in place of the safetensors file a loader looks for (`adapter_model.bin` for
`adapter_model.safetensors`), and `check_no_pickles` refuses a folder handed whole to another library that would
read one. Weights must be finite: a NaN or infinite value is an error naming the file and the tensors, since it
would only show later as NaN embeddings. JSON records (configs, trainer state) are read with a message naming the
file when they are missing, truncated or not an object.

`digest` is the one digest of files: names, sizes and bytes. `fingerprint` tells whether files changed (the runner's
inputs, a search index's model) and reads the bytes of every file up to `CONTENT_LIMIT`, larger files by their
modification time; `file_digest` reads every byte (a model folder an evaluation is keyed by, a user's data file).

Writing a directory all at once: a model or checkpoint is either wholly there or not at all.
`atomic_directory(target)` yields a staging folder beside `target`; when the block succeeds the staging folder
replaces `target` in one rename (an old `target` is first renamed aside, then deleted), and when it fails the
staging folder is removed and `target` is untouched. Killing a run mid-save therefore never leaves a half-written
checkpoint. Permissions follow the umask, as for any folder a user makes: the staging folder is made by `os.mkdir`,
not by `tempfile.mkdtemp` (whose folders are private, 0700), and every folder and file written inside it gets the
mode a new one gets under the umask (safetensors writes its files 0600). An export meant for colleagues is then as
readable as the folder it lies in.

A `target` that is a symlink is written where it points: the link stays. A link to nothing, or a target that is a
file, is an error naming it (`check_target`).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


class CorruptFile(ValueError):
    """A file that exists but cannot be read as what it should be; the message names it and the reason."""


class MissingInput(FileNotFoundError):
    """A stage's input is not in the run directory; the message names the notebook that writes it."""


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def refuse_pickle(path: str | Path) -> None:
    """Raises for a pickle-based weights file: loading one can run arbitrary code."""
    path = Path(path)
    if path.suffix in PICKLE_SUFFIXES:
        raise CorruptFile(
            f"{path}: refusing to load a pickle-based weights file ({path.suffix}); pickles can run code when "
            "loaded. Convert it to safetensors (safetensors.torch.save_file) and load that instead"
        )


def check_no_pickles(folder: str | Path) -> None:
    """Raises, naming them, when `folder` holds pickle-based weight files (for a folder another library reads)."""
    folder = Path(folder)
    found = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES) if folder.is_dir() else []
    if found:
        raise CorruptFile(
            f"{folder}: holds pickle-based weight files {found}; refusing to load the folder (pickles can run code "
            "when loaded). Convert them to safetensors (safetensors.torch.save_file) or remove them"
        )


def _stand_ins(path: Path) -> list[Path]:
    """Pickle files beside a missing safetensors file that a loader could take in its place: the same stem with a
    pickle suffix, and transformers' or peft's names (`model.safetensors` -> `pytorch_model.bin`)."""
    stems = {path.stem, "pytorch_" + path.stem}
    return sorted(p for p in path.parent.glob("*") if p.suffix in PICKLE_SUFFIXES and p.stem in stems)


def check_finite(tensors: dict[str, torch.Tensor], path: str | Path, what: str = "weights") -> None:
    """Raises `CorruptFile` naming the file and the first tensors holding NaN or infinite values."""
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise CorruptFile(
            f"{path}: the {what} file holds non-finite values (NaN or inf) in {len(bad)} tensor(s), e.g. {bad[:3]}; "
            "they would give NaN embeddings"
        )


def load_tensors(path: str | Path, what: str = "weights") -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, checked finite; a missing, truncated, corrupt or non-finite file is named
    with the reason, and a pickle file (or one lying where the safetensors file is missing) is refused unread."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    refuse_pickle(path)
    if not path.is_file():
        for stand_in in _stand_ins(path):
            raise CorruptFile(
                f"{path}: the {what} file is missing, and {stand_in.name} lies in its place: a pickle-based weights "
                "file, refused unread (pickles can run code when loaded). Convert it to safetensors"
            )
        raise FileNotFoundError(f"{path}: the {what} file is missing")
    if path.stat().st_size < 8:
        raise CorruptFile(f"{path}: the {what} file is truncated ({path.stat().st_size} bytes, no safetensors header)")
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CorruptFile(f"{path}: the {what} file is corrupt or truncated ({err})") from None
    check_finite(tensors, path, what)
    return tensors


def tensor_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata of a safetensors file's header (empty when it has none); the file must exist and parse
    (read `load_tensors` first)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return dict(handle.metadata() or {})
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CorruptFile(f"{path}: the header of the safetensors file cannot be read ({err})") from None


def load_json(path: str | Path, what: str = "record") -> dict[str, Any]:
    """A JSON object from a file; a missing file, bad JSON or a non-object is named with the reason."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the {what} file is missing")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptFile(f"{path}: the {what} file is not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise CorruptFile(f"{path}: the {what} file must hold a JSON object, got {type(value).__name__}")
    return value


CONTENT_LIMIT = 4 * 2**20  # files up to this size are fingerprinted by their bytes, larger ones by their time


def every_file(folder: str | Path) -> list[Path]:
    """Every file under `folder`, in path order, through symlinked subfolders too (a folder kept elsewhere and linked
    in is part of what is read; `Path.rglob` skips it), each real folder walked once (a loop of links ends)."""
    found, seen, todo = [], set(), [Path(folder)]
    while todo:
        current = todo.pop()
        if current.resolve() in seen:
            continue
        seen.add(current.resolve())
        for entry in current.iterdir():
            if entry.is_dir():
                todo.append(entry)
            elif entry.is_file():
                found.append(entry)
    return sorted(found)


def _sha256(file: Path) -> str:
    """The sha256 of a file's bytes, in hex, read in blocks."""
    content = hashlib.sha256()
    with file.open("rb") as handle:
        while block := handle.read(1 << 20):
            content.update(block)
    return content.hexdigest()


def digest(files: Iterable[tuple[str, Path]], content_limit: int | None = CONTENT_LIMIT) -> str:
    """16 hex digits of sha256 over each (name, file): its name and size, and its bytes when it holds at most
    `content_limit` (by default `CONTENT_LIMIT`: records, configs, trainer states, source code and data files of a
    usual size; None: every file), else its modification time (weights and large tables, too large to read at every
    --resume: a rewritten one has a new time; a large one copied in with its size and time kept, `cp -p`, goes
    unseen)."""
    total = hashlib.sha256()
    for name, file in files:
        stat = file.stat()
        if content_limit is None or stat.st_size <= content_limit:
            total.update(f"{name}\t{stat.st_size}\t{_sha256(file)}\n".encode())
        else:
            total.update(f"{name}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return total.hexdigest()[:16]


def fingerprint(path: str | Path, name: str, content_limit: int | None = CONTENT_LIMIT) -> str:
    """`digest` of a file (named `name`), or of every file under a folder (`every_file`, named `name/<path inside>`)
    but for hidden entries (staging folders, a lock, a download's `.cache/`) and `cache-*` files (what `datasets` adds
    beside a table it maps), which change without what is read changing; "missing" when nothing is at `path`."""
    path = Path(path)
    if not path.exists():
        return "missing"
    if not path.is_dir():
        return digest([(name, path)], content_limit)
    inside = [(file.relative_to(path), file) for file in every_file(path)]
    return digest(
        ((f"{name}/{rel.as_posix()}", file)
         for rel, file in inside
         if not any(part.startswith(".") for part in rel.parts) and not file.name.startswith("cache-")),
        content_limit,
    )  # fmt: skip


def file_digest(path: str | Path) -> str:
    """A content digest that reads every byte: of a file, the sha256 of its bytes in hex (what `sha256sum` prints, so a
    user can check a recorded one); of a folder, `fingerprint` with no file taken by its time, independent of where
    the folder lies: a copy elsewhere has the same digest, a byte changed or moved across files another."""
    path = Path(path)
    return fingerprint(path, ".", content_limit=None) if path.is_dir() else _sha256(path)


# writing a directory all at once --------------------------------------------------------------------------------
def check_target(target: str | os.PathLike, overwrite: bool = True) -> Path:
    """The folder `target` names, through a symlink if it is one; raises, naming it, for a link to nothing, a file,
    or (without `overwrite`) a folder that holds anything."""
    path = Path(target)
    if path.is_symlink():
        if not path.exists():
            raise FileNotFoundError(f"{path} is a symlink to {os.readlink(path)}, which does not exist: create the "
                                    "folder it points to, or remove the link")  # fmt: skip
        path = path.resolve()
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{target} exists and is a file, not a folder: choose another path")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty; pass overwrite=True to replace it")
    return path


def _make_staging(parent: Path, name: str) -> Path:
    """A new empty folder `.<name>.<random>` in `parent`, made as any folder is (mode 0777 less the umask)."""
    for _ in range(100):
        path = parent / f".{name}.{secrets.token_hex(6)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free staging folder name for {name} in {parent}")


def _follow_umask(staging: Path) -> None:
    """Every folder and file under `staging` gets the mode of a new one under the umask: folders that of `staging`
    (made by `os.mkdir`), files the same less the execute bits. Symlinks are left alone."""
    folder_mode = stat.S_IMODE(staging.stat().st_mode)
    file_mode = folder_mode & 0o666
    for root, folders, files in os.walk(staging):
        for name in folders:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), folder_mode)
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), file_mode)


@contextmanager
def atomic_directory(target: str | os.PathLike) -> Iterator[Path]:
    target = check_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _make_staging(target.parent, target.name)
    try:
        yield staging
        _follow_umask(staging)
        if not target.exists():
            os.replace(staging, target)
            return
        old = _make_staging(target.parent, f"{target.name}.old")
        os.replace(target, old)  # renamed aside first: a kill here leaves it whole, never half deleted
        try:
            os.replace(staging, target)
        except BaseException:
            os.replace(old, target)
            raise
        shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
