"""hardware.py: the peak resident memory of the processes a notebook starts (known answers on real processes)."""

import json
import os
import subprocess
import sys
import time

import pytest

from c2llm_lib.hardware import PeakMemory, descendants, high_water_kib

pytestmark = pytest.mark.skipif(not os.path.isfile("/proc/self/status"), reason="reads Linux's /proc")
TOUCH = "import sys, time; block = b'x' * (int(sys.argv[1]) * 2**20); time.sleep(float(sys.argv[2]))"


def test_high_water_is_at_least_the_current_resident_memory():
    status = open("/proc/self/status").read()
    rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
    assert high_water_kib() >= rss > 0
    assert high_water_kib(os.getpid()) >= rss


def test_a_process_that_is_gone_has_no_high_water():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert high_water_kib(child.pid) is None


def test_descendants_reach_grandchildren():
    """Other children of the test process may live beside the shell: only the shell's own subtree is known."""
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        for _ in range(200):  # the shell forks, and its child then becomes `sleep` (until the exec it is still `sh`)
            grandchildren = descendants(shell.pid)
            if len(grandchildren) == 1 and open(f"/proc/{grandchildren[0]}/comm").read().strip() == "sleep":
                break
            time.sleep(0.05)
        assert len(grandchildren) == 1
        assert open(f"/proc/{grandchildren[0]}/comm").read().strip() == "sleep"
        below = descendants(os.getpid())
        assert shell.pid in below and grandchildren[0] in below
    finally:
        shell.kill()
        shell.wait()


def measure(script: str) -> int | None:
    """`PeakMemory` around `script` run in a fresh interpreter, so that no earlier child's peak counts."""
    head = "import json, subprocess, sys\nfrom c2llm_lib.hardware import PeakMemory\n"
    code = f"{head}{script}\nprint(json.dumps(peak.kib))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_the_peak_of_a_child_seen_while_it_lives():
    """The child touches 300 MiB at once and lives one more second: samples every 0.5 s read its high-water mark."""
    kib = measure(f"with PeakMemory(0.5) as peak:\n    subprocess.run([sys.executable, '-c', {TOUCH!r}, '300', '1'])")
    assert 300 * 1024 <= kib < 600 * 1024


def test_a_peak_already_released_is_still_seen():
    """The child touches 300 MiB, frees it, and lives on small: the high-water mark keeps the peak."""
    script = "import time; block = b'x' * (300 * 2**20); del block; time.sleep(1)"
    kib = measure(f"with PeakMemory(0.5) as peak:\n    subprocess.run([sys.executable, '-c', {script!r}])")
    assert 300 * 1024 <= kib < 600 * 1024


def test_the_largest_single_process_not_the_sum():
    start = "subprocess.Popen([sys.executable, '-c', {!r}, '{}', '1'])"
    two = (f"with PeakMemory(0.05) as peak:\n    a = {start.format(TOUCH, 200)}\n    b = {start.format(TOUCH, 300)}\n"
           "    a.wait(); b.wait()")  # fmt: skip
    kib = measure(two)
    assert 300 * 1024 <= kib < 500 * 1024  # the larger one, not 500 MiB


def test_a_process_running_before_the_block_is_not_counted():
    """A child touching 300 MiB runs through the whole block: only the block's own small child counts."""
    start = f"before = subprocess.Popen([sys.executable, '-c', {TOUCH!r}, '300', '3'])\nimport time\ntime.sleep(1)\n"
    small = f"subprocess.run([sys.executable, '-c', {TOUCH!r}, '1', '0.5'])"
    block = f"with PeakMemory(0.05) as peak:\n    {small}\nbefore.kill()"
    kib = measure(start + block)
    assert 0 < kib < 300 * 1024


def test_no_child_no_peak():
    assert measure("with PeakMemory(0.05) as peak:\n    pass") == 0


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match=r"PeakMemory\(interval=...\) must be a positive number of seconds, at most 60 "
                       r"\(how often the processes are sampled\), got 0"):  # fmt: skip
        PeakMemory(0)
    for bad in ("1", None, True, float("nan"), -1.0, float("inf"), 1e300, 61):  # inf, 1e300: OverflowError in a thread
        with pytest.raises(ValueError, match=r"PeakMemory\(interval=...\) must be a positive number of seconds"):
            PeakMemory(bad)
    assert PeakMemory(60).interval == 60


def test_one_peak_memory_measures_blocks_one_after_the_other():
    """A second `with` on the same object was a raw RuntimeError ("threads can only be started once")."""
    small = f"subprocess.run([sys.executable, '-c', {TOUCH!r}, '1', '0.3'])"
    big = f"subprocess.run([sys.executable, '-c', {TOUCH!r}, '200', '0.3'])"
    script = f"peak = PeakMemory(0.05)\nwith peak:\n    {big}\nfirst = peak.kib\nwith peak:\n    {small}"
    second = measure(script)  # the same object's second block
    first = measure(f"peak = PeakMemory(0.05)\nwith peak:\n    {big}")
    assert first > 200 * 1024 and 0 < second < 150 * 1024  # each block its own peak
    with pytest.raises(RuntimeError, match="already measuring a block"):
        with PeakMemory(0.05) as peak:
            with peak:
                pass
