"""`c2llm_lib/files.py`: a process's scratch folder, and the folders of killed processes that the next one removes."""

import os
import subprocess
import sys

import pytest

from c2llm_lib.files import OWNER, scratch_folder


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


def test_a_scratch_folder_names_and_records_its_maker(tmp_path):
    folder = scratch_folder(tmp_path, ".run.preflight-")
    assert folder.parent == tmp_path and folder.name.startswith(f".run.preflight-{os.getpid()}-")
    assert (folder / OWNER).read_text() == f"{os.getpid()}\n"
    assert scratch_folder(tmp_path, ".run.preflight-") != folder  # a second one, the first kept: its maker lives
    assert folder.is_dir()


def test_only_the_folders_of_dead_makers_with_the_prefix_are_removed(tmp_path):
    gone = dead_pid()
    folders = {
        "stale": (tmp_path / f"c2llm-data-{gone}-abc", str(gone)),
        "live": (tmp_path / f"c2llm-data-{os.getpid()}-def", str(os.getpid())),
        "no pid": (tmp_path / "c2llm-data-notes", None),  # a user's folder that happens to share the prefix
        "garbled": (tmp_path / "c2llm-data-1-x", "not a pid"),
        "negative": (tmp_path / "c2llm-data-2-x", "-5"),  # os.kill(-5, 0) would ask after a process group
        "too large": (tmp_path / "c2llm-data-3-x", str(2**70)),
        "other prefix": (tmp_path / f".run.preflight-{gone}-x", str(gone)),
    }
    for folder, owner in folders.values():
        folder.mkdir()
        (folder / "table.arrow").write_bytes(b"rows")
        if owner is not None:
            (folder / OWNER).write_text(owner + "\n")
    elsewhere = tmp_path / "elsewhere"  # a link with the prefix, to a dead maker's folder: not followed, kept
    elsewhere.mkdir()
    (elsewhere / OWNER).write_text(f"{gone}\n")
    (tmp_path / f"c2llm-data-{gone}-link").symlink_to(elsewhere)
    made = scratch_folder(tmp_path, "c2llm-data-")
    assert not folders["stale"][0].exists()
    assert all(folder.exists() for key, (folder, _) in folders.items() if key != "stale")
    assert (tmp_path / f"c2llm-data-{gone}-link").is_symlink() and (elsewhere / OWNER).is_file()
    assert made.is_dir()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")
def test_another_users_folder_is_left_alone(tmp_path):
    gone = dead_pid()
    theirs = tmp_path / f"c2llm-data-{gone}-theirs"
    theirs.mkdir()
    (theirs / OWNER).write_text(f"{gone}\n")
    os.chown(theirs, 65534, 65534)  # nobody's
    scratch_folder(tmp_path, "c2llm-data-")
    assert (theirs / OWNER).is_file()
