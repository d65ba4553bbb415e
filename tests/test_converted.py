"""model/converted.py's store-once logic on small text files: stored whole, read back, damage named and replaced,
one process at a time, a write that fails named (the GGUF conversion itself: tests/test_gguf.py)."""

import re
import threading
import time
import warnings

import pytest

from c2llm_lib.model.converted import DIGEST, through_copy


class Source:
    """A stand-in conversion: counts its calls; saves its result as `value.txt`."""

    def __init__(self, value: str = "converted") -> None:
        self.value, self.calls = value, 0

    def convert(self) -> str:
        self.calls += 1
        return self.value

    @staticmethod
    def read(folder) -> str:
        return (folder / "value.txt").read_text()

    @staticmethod
    def save(value: str, staging) -> None:
        (staging / "value.txt").write_text(value)


def load(folder, source: Source) -> str:
    return through_copy(folder, source.read, source.convert, source.save)


def test_a_copy_is_stored_once_with_its_digest_and_read_back(tmp_path):
    folder, source = tmp_path / "copy" / "float32", Source()
    assert load(folder, source) == "converted" and source.calls == 1
    assert (folder / DIGEST).is_file() and Source.read(folder) == "converted"
    assert load(folder, source) == "converted" and source.calls == 1  # read, not converted
    assert load(None, source) == "converted" and source.calls == 2  # no copy for this source: converted each time


@pytest.mark.parametrize("damage", ["changed", "extra file", "no digest"])
def test_a_damaged_copy_is_named_converted_again_and_replaced(tmp_path, damage):
    folder = tmp_path / "copy" / "float32"
    load(folder, Source("first"))
    if damage == "changed":
        (folder / "value.txt").write_text("tampered")
    elif damage == "extra file":
        (folder / "pytorch_model.bin").write_bytes(b"a pickle would be read by transformers")
    else:
        (folder / DIGEST).unlink()
    source = Source("again")
    with pytest.warns(
        UserWarning, match=re.escape(f"converted copy {folder} ") + ".*digest.*converting the GGUF again"
    ):
        assert load(folder, source) == "again"
    assert source.calls == 1 and not (folder / "pytorch_model.bin").exists()
    assert load(folder, Source("unused")) == "again"  # the replacement is whole


def test_a_read_error_of_a_whole_copy_is_not_taken_for_damage(tmp_path):
    folder = tmp_path / "copy" / "float32"
    load(folder, Source())

    def failing_read(folder):
        raise MemoryError("no room to read it")

    with pytest.raises(MemoryError):
        through_copy(folder, failing_read, Source().convert, Source.save)
    assert Source.read(folder) == "converted"  # the good copy is kept


def test_a_copy_that_cannot_be_stored_is_named_and_the_result_returned(tmp_path):
    folder, source = tmp_path / "copy" / "float32", Source()

    def full_disk(value, staging):
        (staging / "value.txt").write_text(value[:3])
        raise Exception("No space left on device")  # as safetensors and tokenizers raise it

    with pytest.warns(UserWarning, match=r"could not be stored .*No space left"):
        assert through_copy(folder, source.read, source.convert, full_disk) == "converted"
    assert not folder.exists() and not list(folder.parent.glob(".float32.*"))  # nothing half written is left
    (tmp_path / "file").write_text("a file where the cache folder should be")
    with pytest.warns(UserWarning, match="could not be stored"):
        assert load(tmp_path / "file" / "copy" / "float32", source) == "converted"


def test_a_whole_copy_in_a_cache_that_cannot_be_written_is_still_read(tmp_path):
    folder, source = tmp_path / "copy" / "float32", Source()
    load(folder, source)
    (folder.parent / "float32.lock").unlink()
    (folder.parent / "float32.lock").mkdir()  # the lock cannot be opened, as in a read-only cache
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read, without a warning
        assert load(folder, source) == "converted" and source.calls == 1
    (folder / "value.txt").write_text("tampered")
    with pytest.warns(UserWarning, match="could not be stored"):
        assert load(folder, source) == "converted" and source.calls == 2  # damaged there: converted, not stored


def test_a_digest_that_cannot_be_read_counts_as_damage(tmp_path):
    folder = tmp_path / "copy" / "float32"
    load(folder, Source("first"))
    (folder / DIGEST).write_bytes(b"\xff\xfe not text")
    with pytest.warns(UserWarning, match="cannot be checked against the digest"):
        assert load(folder, Source("again")) == "again"


def test_staging_left_by_a_killed_process_is_removed(tmp_path):
    folder = tmp_path / "copy" / "float32"
    (tmp_path / "copy" / ".float32.0123456789ab").mkdir(parents=True)
    (tmp_path / "copy" / ".float32.0123456789ab" / "model.safetensors").write_bytes(b"half")
    load(folder, Source())
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["float32", "float32.lock"]


def test_a_replaced_copy_left_aside_by_a_killed_process_is_removed_when_the_copy_is_read(tmp_path):
    """A kill between a replacement's two renames' success and the removal of the old copy leaves the new copy whole and
    the old one aside (`files.atomic_directory`): the next load reads the copy and removes what was set aside."""
    folder = tmp_path / "copy" / "float32"
    load(folder, Source("first"))
    aside = tmp_path / "copy" / ".float32.old.0123456789ab"
    aside.mkdir()
    (aside / "model.safetensors").write_bytes(b"the replaced copy")
    source = Source("second")
    assert load(folder, source) == "first" and source.calls == 0  # read, not converted
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["float32", "float32.lock"]


def test_without_locks_no_staging_is_removed(tmp_path, monkeypatch):
    """Where the file system has no locks, another process may be staging its copy right now: nothing is swept."""
    from c2llm_lib.model import converted

    def no_locks(*args):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(converted.fcntl, "flock", no_locks)
    folder = tmp_path / "copy" / "float32"
    other = tmp_path / "copy" / ".float32.0123456789ab"  # another process's staging, in progress
    other.mkdir(parents=True)
    assert load(folder, Source("first")) == "first" and other.is_dir()  # converted and stored beside it
    assert load(folder, Source("second")) == "first" and other.is_dir()  # read beside it


def test_a_second_loader_waits_for_the_first_and_reads_its_copy(tmp_path):
    folder, started, release = tmp_path / "copy" / "float32", threading.Event(), threading.Event()
    first, second = Source("first"), Source("second")

    def slow_convert():
        started.set()
        release.wait(10)
        return first.convert()

    results = {}
    one = threading.Thread(target=lambda: results.setdefault(1, through_copy(folder, Source.read, slow_convert,
                                                                             Source.save)))  # fmt: skip
    one.start()
    started.wait(10)
    two = threading.Thread(target=lambda: results.setdefault(2, load(folder, second)))
    two.start()
    time.sleep(0.3)
    assert two.is_alive()  # held at the lock while the first converts
    release.set()
    one.join(10)
    two.join(10)
    assert results == {1: "first", 2: "first"} and first.calls == 1 and second.calls == 0
