"""A local hub mirror (`c2llm_lib.data.mirror`) is read for what it holds now: the MTEB test data of a second mirror,
or of a mirror rewritten in place, is never answered from the `datasets` cache of the first."""

import json
import os

import pytest

from c2llm_lib.data import DataError
from c2llm_lib.data.decontamination import mteb_test_keys
from c2llm_lib.data.mirror import content_digest, repo_dir, write_dataset_card
from c2llm_lib.data.records import text_key
from c2llm_lib.data.sources import mteb_tasks

from hub_mirror import coir_set

COSQA = "CoIR-Retrieval/cosqa"


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """An empty `datasets` cache of the test's own, so that the first load really fills it."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    return tmp_path / "hf-datasets"


def cosqa_mirror(root, rewritten: int = 0):
    """A mirror holding CoIR's CosQA only (6 test queries), the first `rewritten` test queries given new texts."""
    repo = repo_dir(root, COSQA)
    coir_set(repo, "", COSQA, "python", multilang=False)
    if rewritten:
        rewrite_queries(repo, rewritten)
    write_dataset_card(repo)
    return root


def rewrite_queries(repo, count: int) -> list[str]:
    path = repo / "queries" / "queries.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    new = []
    for row in rows:
        if row["_id"].startswith("test-") and int(row["_id"].removeprefix("test-q")) < count:
            row["text"] = f"a rewritten test query {row['_id']}"
            new.append(row["text"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return new


def seen_queries(mirror) -> frozenset[str]:
    queries, _ = mteb_test_keys(mteb_tasks(["CosQA"], mirror))
    return queries


def test_a_second_mirror_is_read_for_its_own_test_data(tmp_path, datasets_cache):
    first = cosqa_mirror(tmp_path / "first")
    second = cosqa_mirror(tmp_path / "second", rewritten=6)
    new = {text_key(f"a rewritten test query test-q{i}") for i in range(6)}
    assert not new & seen_queries(first)
    assert new <= seen_queries(second)  # all 6 rewritten queries are seen (the first mirror's cache gave 0 of 6)


def test_a_mirror_rewritten_in_place_is_read_again(tmp_path, datasets_cache):
    mirror = cosqa_mirror(tmp_path / "mirror")
    before = seen_queries(mirror)
    path = repo_dir(mirror, COSQA) / "queries" / "queries.jsonl"
    stat = path.stat()
    new = rewrite_queries(repo_dir(mirror, COSQA), 6)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with its old modification time
    after = seen_queries(mirror)
    assert {text_key(t) for t in new} <= after and after != before
    assert seen_queries(mirror) == after  # unchanged since: the same again (from its own cache)


def test_a_task_folder_linked_to_another_dataset_is_refused(tmp_path):
    mirror = cosqa_mirror(tmp_path / "mirror")
    apps = repo_dir(mirror, "CoIR-Retrieval/apps")
    coir_set(apps, "", "CoIR-Retrieval/apps", "python", multilang=False)
    write_dataset_card(apps)
    cosqa = repo_dir(mirror, COSQA)
    cosqa.rename(tmp_path / "cosqa-elsewhere")
    cosqa.symlink_to(apps, target_is_directory=True)  # CosQA's test queries would be Apps'
    with pytest.raises(
        DataError,
        match=r"MTEB task CosQA: the mirror folders CoIR-Retrieval__cosqa/ and "
        r"CoIR-Retrieval__apps/ \(dataset CoIR-Retrieval/apps\) are one folder",
    ):
        mteb_tasks(["CosQA"], mirror)
    cosqa.unlink()
    cosqa.symlink_to(tmp_path / "cosqa-elsewhere", target_is_directory=True)  # a link out of the mirror: its own
    assert mteb_tasks(["CosQA"], mirror)[0].metadata.dataset["path"] == str((tmp_path / "cosqa-elsewhere").resolve())


def test_the_content_digest_follows_a_linked_config_folder(tmp_path):
    """A config folder kept elsewhere (a symlink) is part of the dataset's content; a loop of links ends."""
    repo = repo_dir(cosqa_mirror(tmp_path / "mirror"), COSQA)
    (repo / "queries").rename(tmp_path / "queries-elsewhere")
    (repo / "queries").symlink_to(tmp_path / "queries-elsewhere", target_is_directory=True)
    (tmp_path / "queries-elsewhere" / "loop").symlink_to(repo, target_is_directory=True)
    before = content_digest(repo)
    rewrite_queries(repo, 1)
    assert content_digest(repo) != before
