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

mteb reads a dataset by the config names its card declares, so a mirrored dataset whose `README.md` is missing or
does not declare one of its `<config>/` folders is refused by name (`check_card`) before mteb runs; `datasets` itself
would fail later with "BuilderConfig 'corpus' not found", naming neither the folder nor the card. CodeEditSearch is
the exception: mteb reads it by language folder (`data_dir`), without a card.

A relative `hub_mirror` is resolved from the working directory, which is `notebooks/` for a notebook; the error for
a missing mirror says so.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import yaml

from .records import DataError
from .sources import SOURCES

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
    if not any(s.hub_id == source and s.layout == "pairs" for s in SOURCES.values()):  # read by config name
        check_card(local, f"MTEB task {cls.metadata.name}")
    metadata = cls.metadata.model_copy(update={"dataset": {**cls.metadata.dataset, "path": str(local.resolve())}})
    return type(cls.__name__, (cls,), {"metadata": metadata, "__module__": cls.__module__})()


def mteb_tasks(names: Sequence[str], mirror: str | Path | None = None) -> list:
    """mteb task objects by name: from the hub, or reading from a local mirror folder when one is given."""
    import mteb

    tasks = list(mteb.get_tasks(tasks=list(names)))
    if mirror is None:
        return tasks
    if not Path(mirror).is_dir():
        raise DataError(f"hub_mirror {str(mirror)!r} is not a directory" + relative_note(mirror))
    return [mirrored_task(t, mirror) for t in tasks]
