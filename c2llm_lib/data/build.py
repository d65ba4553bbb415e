"""Notebook 01's stage: the training set of a run from the offline snapshot, the hub, a user's files or a user's code
(section 4.1), decontaminated, capped per group and given K hard negatives (docs/data.md)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..config import DataStage
from .beir import beir_keys
from .code_trees import prepare_code
from .decontamination import MTEB_CODE_TASKS, NO_SETS, SetKeys, mteb_test_keys
from .files import prepare_files
from .mirror import relative_note
from .mix import Prepared, add_hard_negatives, fingerprint_of, group_indices, prepare_rows, prepare_sources
from .offline import humaneval_records, load_snapshot
from .records import DataError, RowChecker
from .sources import mteb_tasks as mirrored_mteb_tasks
from .tree_walk import code_roots, walked_files
from .unseen import mine_packages, unseen_keys


def offline_eval_texts() -> list[str]:
    rows = [r for r in load_snapshot() if r["split"] == "test"] + humaneval_records()
    return [t for r in rows for t in (r["query"], r["positive"])]


def _kept_indices(groups: Iterable[Sequence[int]], cap: int, seed: int) -> list[int]:
    """Row indices keeping at most `cap` per group (a seeded random subset of larger groups), sorted."""
    rng = random.Random(seed)
    return sorted(int(i) for idx in groups for i in (idx if len(idx) <= cap else rng.sample(list(idx), cap)))


def _capped(rows: list[dict], cap: int | None, seed: int) -> list[dict]:
    if cap is None:
        return rows
    groups: dict[tuple[str, str], list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault((row["dataset"], row["language"]), []).append(i)
    return [rows[i] for i in _kept_indices(groups.values(), cap, seed)]


def _capped_table(prepared: Prepared, stage: DataStage) -> Prepared:
    """The rows with at most `rows_per_group` per group, after decontamination (recorded as `capped`)."""
    if stage.rows_per_group is None:
        return prepared
    groups = group_indices(prepared.rows).values()
    kept = _kept_indices(groups, stage.rows_per_group, stage.seed)
    return prepared.selected(kept, f"rows_per_group {stage.rows_per_group}, seed {stage.seed}")


def own_rows(
    stage: DataStage,
    eval_texts: Sequence[str],
    mteb_keys: tuple[Iterable[str], Iterable[str]] = ((), ()),
    beir: SetKeys = NO_SETS,
    unseen: SetKeys = NO_SETS,
) -> Prepared:
    """A user's rows (files or code) checked, held out and decontaminated; a `DataError` names what cannot be used."""
    if stage.data_source == "files":
        return prepare_files(stage.file_entries(), stage.files_instruction, stage.files_heldout_fraction, eval_texts,
                             mteb_keys, beir=beir, unseen=unseen)  # fmt: skip
    if stage.data_source == "code":
        return prepare_code(stage.code_roots, stage.code_test_percent, eval_texts, mteb_keys, beir, unseen)
    raise ValueError(f"data_source {stage.data_source!r} holds no user data (files or code)")


def decontaminated_mteb_tasks(stage: DataStage) -> list[str]:
    """The MTEB tasks the training rows are checked against: MTEB(Code, v1)'s with `decontaminate_mteb`, else none."""
    return list(MTEB_CODE_TASKS) if stage.decontaminate_mteb else []


def training_files(stage: DataStage) -> dict[str, Iterable[str]]:
    """{training source: the ids of its files} for the unseen-library check (offline snapshot and code roots only)."""
    if stage.data_source == "offline":
        snapshot = "the offline snapshot (CPython standard library, lodash)"
        return {snapshot: sorted({row["file"] for row in load_snapshot() if row["split"] == "train"})}
    if stage.data_source == "code":  # code_roots names a bad root, as mining would
        roots = code_roots(stage.code_roots)
        return {f"code root {root}": [file for file, _ in walked_files(root)] for _, root in roots}
    return {}


def build_training_data(
    stage: DataStage, local_root: str | Path | None = None, mteb_tasks: Sequence[Any] | None = None
) -> tuple[Prepared, dict[str, int]]:
    """(prepared rows with negatives, rows per group short of K); `local_root` and `mteb_tasks` stand in for the hub."""
    if stage.hub_mirror is not None:
        if not Path(stage.hub_mirror).is_dir():
            raise DataError(f"hub_mirror {stage.hub_mirror!r} is not a directory" + relative_note(stage.hub_mirror))
        if local_root is None and stage.data_source == "hub":
            local_root = stage.hub_mirror
        if mteb_tasks is None and stage.decontaminate_mteb:
            mteb_tasks = mirrored_mteb_tasks(MTEB_CODE_TASKS, stage.hub_mirror)
    if local_root is not None and stage.data_source != "hub":
        raise DataError(f"local_root={str(local_root)!r} reads hub sources, but data_source is {stage.data_source!r}")
    if mteb_tasks is not None and not stage.decontaminate_mteb:
        raise DataError("mteb_tasks were given to decontaminate against, but decontaminate_mteb is false")
    eval_texts = offline_eval_texts()
    beir = beir_keys(stage.beir_sets)
    unseen = NO_SETS
    if stage.unseen_packages:
        unseen = unseen_keys(mine_packages(stage.unseen_packages), training_files(stage))
    mteb_keys = (
        mteb_test_keys(MTEB_CODE_TASKS if mteb_tasks is None else mteb_tasks) if stage.decontaminate_mteb else ((), ())
    )
    if stage.data_source == "offline":
        snapshot = _capped([r for r in load_snapshot() if r["split"] == "train"], stage.rows_per_group, stage.seed)

        def rows(checker: RowChecker) -> Iterator[dict]:
            for row in snapshot:
                record = checker.record(row["dataset"], f"{row['file']}:{row['function']}", row["query"],
                                        row["positive"], row["language"], row["instruction"])  # fmt: skip
                if record is not None:
                    yield record

        # prepare_rows adds the hash of every decontamination key to this fingerprint
        fingerprint = fingerprint_of("offline", stage.rows_per_group, stage.seed)
        prepared = prepare_rows(rows, fingerprint, eval_texts, mteb_keys=mteb_keys, beir=beir, unseen=unseen)
    elif stage.data_source in ("files", "code"):
        prepared = _capped_table(own_rows(stage, eval_texts, mteb_keys, beir, unseen), stage)
    else:
        prepared = prepare_sources(stage.hub_sources, local_root, eval_texts, mteb_keys=mteb_keys, beir=beir,
                                   unseen=unseen)  # fmt: skip
        prepared = _capped_table(prepared, stage)
    keep_given = stage.data_source == "files"  # a user's own negatives stay; the hub's and snapshot's are mined
    return add_hard_negatives(prepared, k=stage.num_negatives, method=stage.mining, keep_given=keep_given)
