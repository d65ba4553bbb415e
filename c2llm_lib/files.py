"""Reading run and model files with errors that name the file (weights from safetensors only, finite; a pickle is
refused unread); the one digest of files; `atomic_directory` and `replace_text`, which write a folder or a file
whole or not at all; `scratch_folder`, a process's own temporary folder, which a later one removes if it was killed.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import secrets
import shutil
import stat
import tempfile
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
    """Pickle files a loader could take in place of the missing safetensors file `path`."""
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
    """All tensors of a safetensors file, checked finite; a missing, corrupt or non-finite file is named, and a pickle
    file (or one lying where the safetensors file is missing) is refused unread."""
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
    """The string metadata of a safetensors file's header (empty when none); read `load_tensors` first."""
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
    """Every file under `folder` in path order, through symlinked subfolders (which `Path.rglob` skips)."""
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
    content = hashlib.sha256()
    with file.open("rb") as handle:
        while block := handle.read(1 << 20):
            content.update(block)
    return content.hexdigest()


def digest(files: Iterable[tuple[str, Path]], content_limit: int | None = CONTENT_LIMIT) -> str:
    """16 hex digits of sha256 over each (name, file): name, size, and the bytes of a file up to `content_limit` (None:
    every file), a larger one by its modification time (so a `cp -p` copy of the same size goes unseen)."""
    total = hashlib.sha256()
    for name, file in files:
        stat = file.stat()
        if content_limit is None or stat.st_size <= content_limit:
            total.update(f"{name}\t{stat.st_size}\t{_sha256(file)}\n".encode())
        else:
            total.update(f"{name}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return total.hexdigest()[:16]


def fingerprint(path: str | Path, name: str, content_limit: int | None = CONTENT_LIMIT) -> str:
    """`digest` of a file or a folder's files (hidden and `cache-*` aside); "missing" when nothing is there."""
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
    """A digest of every byte: a file's sha256 hex (as `sha256sum`), a folder's independent of where it lies."""
    path = Path(path)
    return fingerprint(path, ".", content_limit=None) if path.is_dir() else _sha256(path)


# a process's scratch ----------------------------------------------------------------------------------------------
OWNER = ".owner.json"  # inside a scratch folder: who made it (pid, host, pid namespace)
_SWEPT: set[tuple[str, str]] = set()  # (parent, prefix) this process has swept already


def _maker() -> dict[str, Any]:
    """This process as a scratch folder records it: a pid means something only on its host and in its namespace."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = None
    return {"pid": os.getpid(), "host": platform.node(), "pid_namespace": namespace}


def _orphaned(folder: os.DirEntry, prefix: str, here: dict[str, Any]) -> bool:
    """Whether `folder` is a scratch folder of `prefix` made on this host, in this pid namespace, by this user, by a
    process that is gone; anything unreadable or made elsewhere is not (a pid elsewhere cannot be asked after)."""
    try:
        if not folder.is_dir(follow_symlinks=False) or folder.stat(follow_symlinks=False).st_uid != os.getuid():
            return False
        record = Path(folder.path) / OWNER
        found = os.lstat(record)
        if not stat.S_ISREG(found.st_mode) or found.st_size > 4096:
            return False  # a link, a pipe (read would block) or a file too large to be a record
        maker = json.loads(record.read_text())
        pid = maker["pid"]
        if here["pid_namespace"] is None or any(maker[key] != here[key] for key in ("host", "pid_namespace")):
            return False
        if type(pid) is not int or pid <= 0 or not folder.name.startswith(f"{prefix}{pid}-"):
            return False  # a bool, a float, or a record that does not name the folder's maker
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError, TypeError, KeyError, OverflowError):
        pass  # unreadable, not a record of ours, or another user's live process
    return False


def scratch_folder(parent: str | Path, prefix: str) -> Path:
    """A new folder `<prefix><pid>-*` in `parent` for this process's temporary files, its maker recorded inside. Its
    maker removes it; a killed process removes nothing, so the first call of a process for `parent` and `prefix`
    removes the folders of `prefix` whose maker is gone, and only those (`_orphaned`): a folder made on another host
    sharing the filesystem, in another pid namespace, by another user, or without a readable record is left alone."""
    here = _maker()
    if (str(parent), prefix) not in _SWEPT:
        _SWEPT.add((str(parent), prefix))
        with os.scandir(parent) as entries:
            orphans = [Path(e.path) for e in entries if e.name.startswith(prefix) and _orphaned(e, prefix, here)]
        for orphan in orphans:
            shutil.rmtree(orphan, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
    try:
        (folder / OWNER).write_text(json.dumps(here) + "\n")
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)  # a folder without its record could never be swept
        raise
    return folder


# writing a directory all at once --------------------------------------------------------------------------------
def check_target(target: str | os.PathLike, overwrite: bool = True) -> Path:
    """The folder `target` names, through a symlink; refuses a broken link, a file, or (no `overwrite`) a full
    folder."""
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
    """A new empty folder `.<name>.<random>` in `parent`, mode 0777 less the umask (not mkdtemp's 0700)."""
    for _ in range(100):
        path = parent / f".{name}.{secrets.token_hex(6)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free staging folder name for {name} in {parent}")


def _follow_umask(staging: Path) -> None:
    """Gives every folder and file under `staging` the mode a new one gets under the umask (files lose execute bits)."""
    folder_mode = stat.S_IMODE(staging.stat().st_mode)
    file_mode = folder_mode & 0o666
    for root, folders, files in os.walk(staging):
        for name in folders:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), folder_mode)
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), file_mode)


def replace_text(path: Path, text: str) -> None:
    """Writes `text` to `path` whole or not at all: into `.<name>.tmp` beside it, then renamed over it."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
