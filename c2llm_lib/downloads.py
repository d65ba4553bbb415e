"""Wheels fetched from the package index into the cache's `wheels/` folder, pinned by version and sha256: moved in
whole from a staging folder, and refused by name when the sha256 differs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .files import file_digest
from .pins import canonical


class FetchError(RuntimeError):
    """A pinned file could not be fetched, or did not match its pinned digest; the message names it."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("C2LLM_CACHE") or Path.home() / ".cache" / "c2llm")


def _cached(wheel_dir: Path, package: str, version: str) -> list[Path]:
    """The wheels of `package==version` in `wheel_dir` (a wheel's file name: <name>-<version>-...)."""
    parts = {path: path.name.split("-") for path in wheel_dir.glob("*.whl")}
    return sorted(
        p for p, (name, *rest) in parts.items() if canonical(name) == canonical(package) and rest[:1] == [version]
    )


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


def pinned_wheel(package: str, version: str, sha256: str, wheel_dir: Path, needed_for: str) -> Path:
    """The wheel of `package==version` (`pip_wheel`) once the sha256 of its bytes is the pinned one."""
    wheel = pip_wheel(package, version, wheel_dir, needed_for)
    found = file_digest(wheel)
    if found != sha256:
        raise FetchError(
            f"{package} {version} (needed for {needed_for}): {wheel} has sha256 {found}, but sha256 {sha256} is "
            f"pinned: the index's file changed or the cached copy is damaged or altered; refusing it (delete {wheel} "
            "to fetch it again)"
        )
    return wheel
