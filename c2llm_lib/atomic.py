"""Writing a directory all at once: a model or checkpoint is either wholly there or not at all.

`atomic_directory(target)` yields a staging folder beside `target`; when the block succeeds the
staging folder replaces `target` in one rename (an old `target` is first renamed aside, then deleted), and
when it fails the staging folder is removed and `target` is untouched. Killing a run mid-save therefore never
leaves a half-written checkpoint.

Permissions follow the umask, as for any folder a user makes: the staging folder is made by `os.mkdir`, not by
`tempfile.mkdtemp` (whose folders are private, 0700), and every folder and file written inside it gets the mode a
new one gets under the umask (safetensors writes its files 0600). An export meant for colleagues is then as
readable as the folder it lies in.

A `target` that is a symlink is written where it points: the link stays. A link to nothing, or a target that is a
file, is an error naming it (`check_target`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
