"""A local mirror of the hub datasets (paper section 4.1 data, section 4.2 evaluation), for machines without the hub.

Air-gapped clusters, and this repository's own rehearsals of the shipped recipes, read the 12 training sources and
the MTEB(Code, v1) test data from a folder instead of the hub. A mirror folder holds one directory per dataset
repository, named after the hub id with `/` as `__` (`CoIR-Retrieval__apps`), laid out as the repository is at the
pinned revision: one folder per config (`corpus`, `queries`, `default`; `python-corpus`, ... for CoIR's
multi-language sets; one folder per language for CodeEditSearch) holding `<split>.jsonl`, and a `README.md` whose
`configs:` header declares them, as a dataset card on the hub does (`write_dataset_card`).

- Training (`sources.iter_records(local_root=mirror)`) reads the config folders directly.
- Evaluation and decontamination (`mteb_tasks(names, mirror)`) use mteb's own task classes and loaders unchanged;
  only each task's dataset path points into the mirror. So a mirrored task gives exactly what mteb gives from the
  hub: for a CoIR task, the whole corpus (train and valid documents included) for the test split, and for
  CodeEditSearch the first 1,000 rows per language of its train split.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .records import DataError


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


def mirrored_task(task, mirror: str | Path):
    """`task` (an mteb task object) reading its data from the mirror instead of the hub; same class, metadata and
    loader, only `metadata.dataset["path"]` changes (on a subclass, so mteb's registry is untouched)."""
    cls = type(task)
    source = cls.metadata.dataset["path"]
    local = repo_dir(mirror, source)
    if not local.is_dir():
        raise DataError(
            f"MTEB task {cls.metadata.name}: the mirror {mirror} has no {local.name}/ "
            f"(the dataset {source} at revision {cls.metadata.dataset.get('revision', '?')[:8]})"
        )
    metadata = cls.metadata.model_copy(update={"dataset": {**cls.metadata.dataset, "path": str(local.resolve())}})
    return type(cls.__name__, (cls,), {"metadata": metadata, "__module__": cls.__module__})()


def mteb_tasks(names: Sequence[str], mirror: str | Path | None = None) -> list:
    """mteb task objects by name: from the hub, or reading from a local mirror folder when one is given."""
    import mteb

    tasks = list(mteb.get_tasks(tasks=list(names)))
    if mirror is None:
        return tasks
    if not Path(mirror).is_dir():
        raise DataError(f"hub_mirror {mirror!r} is not a directory")
    return [mirrored_task(t, mirror) for t in tasks]
