"""A local mirror of the hub datasets (sections 4.1, 4.2), read by training and by mteb's own task classes in place
of the hub, each mirrored task keyed by its folder's content: docs/data.md#the-papers-sources."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from ..files import digest, every_file
from .records import DataError

FRONT_MATTER = re.compile(r"\A---\r?\n(.*?)\r?\n---", re.DOTALL)


def relative_note(path: str | Path) -> str:
    """For a relative path: where it was looked for (a notebook runs in notebooks/, not where the runner started)."""
    if Path(path).expanduser().is_absolute():
        return ""
    return f" (a relative path is resolved from the working directory, {Path.cwd()}; notebooks run in notebooks/)"


def repo_dir(mirror: str | Path, hub_id: str) -> Path:
    return Path(mirror) / hub_id.replace("/", "__")


def write_dataset_card(repo: str | Path) -> Path:
    """Writes `README.md` declaring every `<config>/<split>.jsonl` under `repo`, so `datasets` reads it as the hub."""
    repo = Path(repo)
    configs = sorted(p for p in repo.iterdir() if p.is_dir() and any(p.glob("*.jsonl")))
    if not configs:
        raise DataError(f"{repo}: no <config>/<split>.jsonl files to declare")
    lines = ["---", "configs:"]
    for config in configs:
        lines += [f"- config_name: {config.name}", "  data_files:"]
        for split in sorted(config.glob("*.jsonl")):
            lines += [f"  - split: {split.stem}", f"    path: {config.name}/{split.name}"]
    lines += ["---", "", f"Local mirror of `{repo.name.replace('__', '/', 1)}` (c2llm_lib.data.mirror).", ""]
    card = repo / "README.md"
    card.write_text("\n".join(lines))
    return card


def check_own_folder(mirror: str | Path, hub_id: str, files: Iterable[str | Path], what: str) -> None:
    """Refuses a folder of `hub_id` that is, or whose `files` resolve into, another dataset's folder."""
    root = Path(mirror)
    own = repo_dir(root, hub_id)
    real_own = own.resolve()
    others = [(o, o.resolve()) for o in sorted(root.iterdir()) if o.name != own.name and "__" in o.name and o.is_dir()]
    for other, real in others:
        if real == real_own:
            raise DataError(
                f"{what}: the mirror folders {own.name}/ and {other.name}/ (dataset {other.name.replace('__', '/', 1)})"
                f" are one folder ({real}): one is a link to the other, so {what} would read another dataset's rows. "
                "Give each dataset a folder of its own"
            )
    for file in files:
        real_file = Path(file).resolve()
        for other, real in others:
            if real_file.is_relative_to(real):
                raise DataError(
                    f"{what}: {file} resolves to {real_file}, in {other.name}/ (dataset "
                    f"{other.name.replace('__', '/', 1)}): {what} would read another dataset's rows. Give each dataset "
                    "files of its own"
                )


def content_digest(folder: str | Path) -> str:
    """A short hash of everything under `folder`: each file's relative path, size and bytes (`files.digest`)."""
    folder = Path(folder)
    return digest(((path.relative_to(folder).as_posix(), path) for path in every_file(folder)), content_limit=None)


@contextmanager
def content_cache(digest: str) -> Iterator[Path]:
    """`datasets` caches what it loads under `<its cache>/c2llm-mirror/<digest>/` while inside the block."""
    import datasets

    before = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = Path(before) / "c2llm-mirror" / digest
    try:
        yield datasets.config.HF_DATASETS_CACHE
    finally:
        datasets.config.HF_DATASETS_CACHE = before


def declared_configs(repo: Path) -> set[str] | None:
    """The config names the `configs:` of `repo/README.md` declare; None when there is no README.md."""
    card = repo / "README.md"
    if not card.is_file():
        return None
    match = FRONT_MATTER.match(card.read_text(encoding="utf-8", errors="replace"))
    try:
        header = yaml.safe_load(match.group(1)) if match else None
    except yaml.YAMLError:
        header = None
    configs = header.get("configs") if isinstance(header, dict) else None
    return {str(c["config_name"]) for c in configs if isinstance(c, dict) and "config_name" in c} if isinstance(
        configs, list) else set()  # fmt: skip


def check_card(repo: Path, what: str) -> None:
    """A DataError naming `repo` and the configs when its README.md does not declare each `<config>/` folder."""
    folders = sorted(p.name for p in repo.iterdir() if p.is_dir() and any(p.glob("*.jsonl")))
    declared = declared_configs(repo)
    undeclared = [f for f in folders if declared is None or f not in declared]
    if declared is None or undeclared:
        problem = "has no README.md" if declared is None else "has a README.md whose configs: do not declare"
        raise DataError(
            f"{what}: the mirror's {repo} {problem} {undeclared or 'its configs'} (mteb reads a dataset by the configs "
            f"its card declares); write the card with c2llm_lib.data.mirror.write_dataset_card({str(repo)!r})"
        )
