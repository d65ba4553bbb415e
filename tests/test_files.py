"""`c2llm_lib/files.py`: a process's scratch folder, and the folders of killed processes that a later one removes
(only those: never a live process's, another host's, another pid namespace's or another user's)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from c2llm_lib import files
from c2llm_lib.files import OWNER, scratch_folder


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


def plant(folder: Path, record) -> Path:
    """A folder as a process left it, with `record` as its maker's record (None: no record)."""
    folder.mkdir()
    (folder / "table.arrow").write_bytes(b"rows")
    if record is not None:
        (folder / OWNER).write_text(record if isinstance(record, str) else json.dumps(record))
    return folder


def test_a_scratch_folder_names_and_records_its_maker(tmp_path):
    folder = scratch_folder(tmp_path, ".run.preflight-")
    assert folder.parent == tmp_path and folder.name.startswith(f".run.preflight-{os.getpid()}-")
    record = json.loads((folder / OWNER).read_text())
    assert record == {"pid": os.getpid(), "host": os.uname().nodename,
                      "pid_namespace": os.stat("/proc/self/ns/pid").st_ino}  # fmt: skip
    assert scratch_folder(tmp_path, ".run.preflight-") != folder  # a second one, the first kept: its maker lives
    assert folder.is_dir()


def test_only_the_folders_of_makers_gone_from_this_host_and_namespace_are_removed(tmp_path):
    gone, here = dead_pid(), files._maker()
    dead = {**here, "pid": gone}
    folders = {
        "stale": plant(tmp_path / f"c2llm-data-{gone}-a", dead),
        "live": plant(tmp_path / f"c2llm-data-{os.getpid()}-b", here),
        "another host": plant(tmp_path / f"c2llm-data-{gone}-c", {**dead, "host": "node-1"}),  # a shared filesystem
        "another namespace": plant(tmp_path / f"c2llm-data-{gone}-d", {**dead, "pid_namespace": 1}),  # a container
        "no record": plant(tmp_path / "c2llm-data-notes", None),  # a user's folder that happens to share the prefix
        "garbled": plant(tmp_path / f"c2llm-data-{gone}-e", "{not json"),
        "not a pid": plant(tmp_path / "c2llm-data-1-f", {**here, "pid": True}),
        "negative": plant(tmp_path / "c2llm-data--5-g", {**here, "pid": -5}),  # os.kill(-5, 0): a process group
        "too large": plant(tmp_path / f"c2llm-data-{2**70}-h", {**here, "pid": 2**70}),
        "named for another pid": plant(tmp_path / f"c2llm-data-{os.getpid()}-i", dead),
        "another prefix": plant(tmp_path / f".run.preflight-{gone}-j", dead),
        "a longer prefix": plant(tmp_path / f"c2llm-data-x.{gone}-k", dead),
    }
    pipe = plant(tmp_path / f"c2llm-data-{gone}-pipe", None)
    os.mkfifo(pipe / OWNER)  # reading it would wait for a writer for ever
    large = plant(tmp_path / f"c2llm-data-{gone}-large", json.dumps(dead) + " " * 8192)
    folders.update({"a pipe for a record": pipe, "a record too large": large})
    link = tmp_path / f"c2llm-data-{gone}-link"
    link.symlink_to(plant(tmp_path / "elsewhere", dead))  # not followed (rmtree refuses a link too)
    made = scratch_folder(tmp_path, "c2llm-data-")
    assert not folders["stale"].exists()
    assert [key for key, folder in folders.items() if not (folder / "table.arrow").is_file()] == ["stale"]
    assert link.is_symlink() and (tmp_path / "elsewhere" / OWNER).is_file() and made.is_dir()


def test_a_process_sweeps_a_folder_once(tmp_path):
    """Notebook 01 makes a folder per own data file: the sweep runs on the first, not again on each."""
    scratch_folder(tmp_path, "c2llm-data-")
    gone = dead_pid()
    later = plant(tmp_path / f"c2llm-data-{gone}-a", {**files._maker(), "pid": gone})
    scratch_folder(tmp_path, "c2llm-data-")
    assert later.exists()


def test_a_folder_whose_record_cannot_be_written_is_not_left(tmp_path, monkeypatch):
    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError, match="No space left"):
        scratch_folder(tmp_path, "c2llm-data-")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")
def test_another_users_folder_is_left_alone(tmp_path):
    gone = dead_pid()
    theirs = plant(tmp_path / f"c2llm-data-{gone}-theirs", {**files._maker(), "pid": gone})
    os.chown(theirs, 65534, 65534)  # nobody's
    scratch_folder(tmp_path, "c2llm-data-")
    assert (theirs / OWNER).is_file()


def test_a_live_makers_folder_survives_a_sweep_from_another_pid_namespace(tmp_path):
    """The maker lives, but its pid means nothing in a new pid namespace (a container sharing /tmp)."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                                                     capture_output=True).returncode:  # fmt: skip
        pytest.skip("cannot make a pid namespace here (unshare needs root)")
    maker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from c2llm_lib.files import scratch_folder
        print(scratch_folder({str(tmp_path)!r}, "c2llm-data-"), flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        folder = Path(maker.stdout.readline().strip())
        sweep = f"from c2llm_lib.files import scratch_folder; scratch_folder({str(tmp_path)!r}, 'c2llm-data-')"
        done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", sweep],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert folder.is_dir() and (folder / OWNER).is_file()
    finally:
        maker.kill()
        maker.wait()
