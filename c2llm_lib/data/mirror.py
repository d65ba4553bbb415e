"""A local mirror of the hub datasets (paper section 4.1 data, section 4.2 evaluation), for machines without the hub.

Air-gapped clusters, and this repository's own rehearsals of the shipped recipes, read the 12 training sources and
the MTEB(Code, v1) test data from a folder instead of the hub. A mirror folder holds one directory per dataset
repository, named after the hub id with `/` as `__` (`CoIR-Retrieval__apps`), laid out as the repository is at the
pinned revision: one folder per config (`corpus`, `queries`, `default`; `python-corpus`, ... for CoIR's
multi-language sets; one folder per language for CodeEditSearch) holding `<split>.jsonl`, and a `README.md` whose
`configs:` header declares them, as a dataset card on the hub does (`write_dataset_card`).

- Training (`sources.iter_records(local_root=mirror)`) reads the config folders directly.
- A dataset's folder may be a symlink (to a download kept elsewhere), but not to another dataset's folder of the
  mirror, nor may a file in it resolve into one (`check_own_folder`): the other dataset's rows would train, or be
  evaluated, under this one's name.
- Evaluation and decontamination (`sources.mteb_tasks(names, mirror)`) use mteb's own task classes and loaders
  unchanged; only each task's dataset path points into the mirror. So a mirrored task gives exactly what mteb gives
  from the hub: for a CoIR task, the whole corpus (train and valid documents included) for the test split, and for
  CodeEditSearch the first 1,000 rows per language of its train split.

What a mirrored task holds is its folder's content, not its name: `datasets` files a local folder's tables under
the folder's name and configs, whatever its path and bytes, so a second mirror (or one rewritten in place) would
be read from the first one's Arrow cache. A mirrored task therefore loads into a `datasets` cache of its own
content (`<datasets cache>/c2llm-mirror/<content_digest>/`), and its dataset revision carries the same digest, so
mteb's results are filed under it too (`eval.mteb.run_mteb` recomputes a result of another revision).

mteb reads a dataset by the config names its card declares, so a mirrored dataset whose `README.md` is missing or
does not declare one of its `<config>/` folders is refused by name (`check_card`) before mteb runs; `datasets` itself
would fail later with "BuilderConfig 'corpus' not found", naming neither the folder nor the card. CodeEditSearch is
the exception: mteb reads it by language folder (`data_dir`), without a card.

A relative `hub_mirror` is resolved from the working directory, which is `notebooks/` for a notebook; the error for
a missing mirror says so.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from ..files import every_file
from .records import DataError

FRONT_MATTER = re.compile(r"\A---\r?\n(.*?)\r?\n---", re.DOTALL)


def relative_note(path: str | Path) -> str:
    """For a relative path: where it was looked for (a notebook runs in notebooks/, not where the runner started)."""
    if Path(path).expanduser().is_absolute():
        return ""
    return f" (a relative path is resolved from the working directory, {Path.cwd()}; notebooks run in notebooks/)"


def repo_dir(mirror: str | Path, hub_id: str) -> Path:
    """The mirror's directory for a hub dataset id."""
    return Path(mirror) / hub_id.replace("/", "__")


def write_dataset_card(repo: str | Path) -> Path:
    """Writes `README.md` declaring every `<config>/<split>.jsonl` under `repo` as a config and split, so that
    `datasets.load_dataset(repo, config, split=split)` (and therefore mteb) reads the folder as it reads the hub."""
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
    """Refuses (naming `what`, e.g. "source CosQA", and the other dataset) a mirror folder of `hub_id` that is really
    another dataset's: it resolves to the same place as another dataset folder of the mirror (one links to the
    other), or one of `files` resolves into another dataset's folder. A link out of the mirror is the dataset's own."""
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
    """A short hash of everything under `folder` (`files.every_file`): each file's path relative to it, its size and its
    bytes."""
    folder = Path(folder)
    digest = hashlib.blake2b(digest_size=8)
    for path in every_file(folder):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


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
    """`repo`'s README.md must declare every `<config>/` folder of jsonl files (the card `write_dataset_card`
    writes), or mteb cannot read it by config name; a DataError names the folder and the missing configs."""
    folders = sorted(p.name for p in repo.iterdir() if p.is_dir() and any(p.glob("*.jsonl")))
    declared = declared_configs(repo)
    undeclared = [f for f in folders if declared is None or f not in declared]
    if declared is None or undeclared:
        problem = "has no README.md" if declared is None else "has a README.md whose configs: do not declare"
        raise DataError(
            f"{what}: the mirror's {repo} {problem} {undeclared or 'its configs'} (mteb reads a dataset by the configs "
            f"its card declares); write the card with c2llm_lib.data.mirror.write_dataset_card({str(repo)!r})"
        )
