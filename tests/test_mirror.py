"""The local hub mirror (`c2llm_lib.data.mirror`): a dataset mteb reads by config name needs its card, and a mirror
that is not there is named with where a relative path was looked for."""

import pytest

from c2llm_lib.config import DataStage
from c2llm_lib.data import DataError, prepare_sources
from c2llm_lib.data.build import build_training_data
from c2llm_lib.data.mirror import repo_dir, write_dataset_card
from c2llm_lib.data.sources import mteb_tasks

from hub_mirror import code_edit_search, coir_set


def test_a_dataset_without_its_card_is_named_before_mteb_reads_it(tmp_path):
    """Without README.md, `datasets` saw one 'default' config and mteb failed with "BuilderConfig 'corpus' not
    found", naming neither the folder nor the card."""
    apps = repo_dir(tmp_path, "CoIR-Retrieval/apps")
    coir_set(apps, "", "CoIR-Retrieval/apps", "python", multilang=False)
    with pytest.raises(DataError, match=rf"MTEB task AppsRetrieval: the mirror's {apps} has no README.md "
                       r"\['corpus', 'default', 'queries'\] .*write_dataset_card"):  # fmt: skip
        mteb_tasks(["AppsRetrieval"], tmp_path)
    card = write_dataset_card(apps)
    assert mteb_tasks(["AppsRetrieval"], tmp_path)[0].metadata.dataset["path"] == str(apps.resolve())
    card.write_text(card.read_text().replace("config_name: queries", "config_name: questions"))
    with pytest.raises(DataError, match=r"has a README.md whose configs: do not declare \['queries'\]"):
        mteb_tasks(["AppsRetrieval"], tmp_path)
    card.write_text("no front matter at all\n")
    with pytest.raises(DataError, match=r"do not declare \['corpus', 'default', 'queries'\]"):
        mteb_tasks(["AppsRetrieval"], tmp_path)


def test_code_edit_search_is_read_by_language_folder_without_a_card(tmp_path):
    code_edit_search(repo_dir(tmp_path, "cassanof/CodeEditSearch"))
    assert len(mteb_tasks(["CodeEditSearchRetrieval"], tmp_path)) == 1


def test_a_missing_relative_mirror_says_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    where = rf"hub_mirror 'mirror' is not a directory \(a relative path is resolved from the working directory, " \
        rf"{tmp_path}; notebooks run in notebooks/\)"  # fmt: skip
    with pytest.raises(DataError, match=where):
        mteb_tasks(["AppsRetrieval"], "mirror")
    with pytest.raises(DataError, match=where):  # was: "source AppsRetrieval: no local file mirror/..." (from where?)
        build_training_data(DataStage(data_source="hub", hub_sources=["AppsRetrieval"], hub_mirror="mirror"))
    with pytest.raises(DataError, match=rf"hub_mirror '{tmp_path / 'gone'}' is not a directory$"):
        mteb_tasks(["AppsRetrieval"], tmp_path / "gone")
    with pytest.raises(DataError, match=rf"no local file mirror/CoIR-Retrieval__apps/.*; a relative path is resolved "
                       rf"from {tmp_path}\)"):  # fmt: skip
        prepare_sources(["AppsRetrieval"], local_root="mirror")
