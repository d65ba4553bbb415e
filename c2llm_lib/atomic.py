"""Writing a directory all at once: a model or checkpoint is either wholly there or not at all.

`atomic_directory(target)` yields a staging folder beside `target`; when the block succeeds the
staging folder replaces `target` in one rename, and when it fails the staging folder is removed and
`target` is untouched. Killing a run mid-save therefore never leaves a half-written checkpoint.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_directory(target: str | os.PathLike) -> Iterator[Path]:
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield staging
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
