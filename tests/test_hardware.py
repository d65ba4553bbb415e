"""`dtype: auto` on a CPU: the faster of bf16 and fp32 as measured on this machine, probed once and cached, a cached
entry used only where a short measurement in the process does not contradict its choice."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from c2llm_lib import hardware
from c2llm_lib.hardware import CAPABILITIES, _probe_key, auto_dtype, cpu_dtype, cpu_info, gemm_gflops, resolve_dtype


def planted(tmp_path, fp32: float, bf16: float):
    cache = tmp_path / "cpu-dtype.json"
    cache.write_text(json.dumps({_probe_key(cpu_info()): {"float32": fp32, "bfloat16": bf16}}))
    return cache


def machine(monkeypatch, fp32: float, bf16: float, quick: tuple[float, float] | None = None) -> list[int]:
    """This CPU as a fake one whose GEMMs measure these GFLOP/s (the short confirmation `quick` = (fp32, bf16) where
    given); returns the sizes measured, in order."""
    measured = []

    def fake(dtype, size=1024, seconds=0.5, device="cpu"):
        measured.append(size)
        short = quick if quick is not None and size == hardware.CONFIRM_SIZE else (fp32, bf16)
        return short[0] if dtype == torch.float32 else short[1]

    monkeypatch.setattr(hardware, "gemm_gflops", fake)
    return measured


@pytest.mark.parametrize("fp32,bf16,chosen", [(69.0, 7.5, torch.float32), (23.0, 90.0, torch.bfloat16),
                                              (50.0, 55.0, torch.float32)], ids=["avx2", "amx", "margin"])  # fmt: skip
def test_bf16_only_where_it_measures_faster(tmp_path, monkeypatch, fp32, bf16, chosen):
    measured = machine(monkeypatch, fp32, bf16)
    dtype, why = cpu_dtype(planted(tmp_path, fp32=fp32, bf16=bf16))  # cached figures this CPU confirms
    assert dtype == chosen and f"{bf16:.0f} GFLOP/s in bf16 vs {fp32:.0f} in fp32" in why
    assert measured == [hardware.CONFIRM_SIZE] * 2  # the short confirmation only, no full probe


@pytest.mark.parametrize("fp32,bf16,crafted", [(69.0, 7.5, (23.0, 90.0)), (23.0, 90.0, (69.0, 7.5))],
                         ids=["bf16-planted-on-avx2", "fp32-planted-on-amx"])  # fmt: skip
def test_crafted_but_plausible_figures_do_not_choose_the_dtype(tmp_path, monkeypatch, fp32, bf16, crafted):
    machine(monkeypatch, fp32, bf16)
    cache = planted(tmp_path, fp32=crafted[0], bf16=crafted[1])  # well formed, plausible for another CPU
    with pytest.warns(UserWarning, match=f"{re.escape(str(cache))}: the entry for this CPU is not what it measures"):
        dtype, why = cpu_dtype(cache)
    assert dtype == (torch.bfloat16 if bf16 > fp32 else torch.float32)  # was: the crafted entry's choice
    assert f"{bf16:.0f} GFLOP/s in bf16 vs {fp32:.0f} in fp32" in why  # the figures measured now
    assert json.loads(cache.read_text())[_probe_key(cpu_info())] == {"float32": fp32, "bfloat16": bf16}  # replaced


def test_a_confirmation_that_noise_contradicts_probes_again_without_a_warning(tmp_path, monkeypatch, recwarn):
    measured = machine(monkeypatch, fp32=50.0, bf16=130.0, quick=(50.0, 30.0))  # noisy short measurements, twice
    dtype, why = cpu_dtype(planted(tmp_path, fp32=49.0, bf16=124.0))
    assert dtype == torch.bfloat16 and "130 GFLOP/s in bf16 vs 50 in fp32" in why  # the full probe decided
    assert measured == [hardware.CONFIRM_SIZE] * 4 + [1024] * 2 and not recwarn.list  # and agreed: nothing to name


def test_the_probe_runs_once_and_is_cached(tmp_path, monkeypatch):
    cache = tmp_path / "sub" / "cpu-dtype.json"
    dtype, why = cpu_dtype(cache)
    entry = json.loads(cache.read_text())[_probe_key(cpu_info())]
    assert entry["float32"] > 0 and entry["bfloat16"] > 0
    measured = machine(monkeypatch, entry["float32"], entry["bfloat16"])
    assert cpu_dtype(cache) == (dtype, why)  # read back and confirmed, not probed again
    assert measured == [hardware.CONFIRM_SIZE] * 2
    monkeypatch.undo()
    cache.write_text("not json")  # a damaged cache is measured again, never an error
    with pytest.warns(UserWarning, match="cannot be read as JSON"):
        assert cpu_dtype(cache)[0] in (torch.float32, torch.bfloat16)


CRAFTED = [  # a well-formed JSON entry that must not be trusted, and what the warning says about it
    ({"float32": "fast", "bfloat16": 90.0}, r"figures \{'float32': 'fast'\} are not finite positive"),  # was ValueError
    ({"float32": -1.0, "bfloat16": 90.0}, r"figures \{'float32': -1.0\}"),  # was: bf16 chosen from a crafted figure
    ({"float32": 1.0, "bfloat16": float("inf")}, r"figures \{'bfloat16': inf\}"),
    ({"float32": 1.0, "bfloat16": float("nan")}, r"figures \{'bfloat16': nan\}"),
    ({"float32": True, "bfloat16": 90.0}, r"figures \{'float32': True\}"),
    ({"float32": 1.0, "bfloat16": 90.0, "float8": 900.0}, r"names the dtypes \['bfloat16', 'float32', 'float8'\]"),
    ([1.0, 90.0], r"the entry is a list"),
]


@pytest.mark.parametrize("entry,message", CRAFTED, ids=lambda v: str(v)[:30])
def test_a_cache_entry_that_cannot_be_trusted_is_named_and_probed_again(tmp_path, monkeypatch, entry, message):
    cache = tmp_path / "cpu-dtype.json"
    other = {"another CPU|avx2|2|torch 2.13": {"float32": 60.0, "bfloat16": 7.0}}
    cache.write_text(json.dumps({**other, _probe_key(cpu_info()): entry}))
    with pytest.warns(UserWarning, match=f"{re.escape(str(cache))}: .*{message}.*probing this CPU's GEMM speed again"):
        dtype, why = cpu_dtype(cache)
    probed = json.loads(cache.read_text())
    fresh = probed[_probe_key(cpu_info())]
    assert fresh["float32"] > 0 and fresh["bfloat16"] > 0 and set(fresh) == {"float32", "bfloat16"}
    assert f"GEMM {fresh['bfloat16']:.0f} GFLOP/s in bf16 vs {fresh['float32']:.0f} in fp32" in why  # the new figures
    assert probed["another CPU|avx2|2|torch 2.13"] == other["another CPU|avx2|2|torch 2.13"]  # other machines kept
    machine(monkeypatch, fresh["float32"], fresh["bfloat16"])  # this CPU, measuring as it did (no load's noise)
    assert cpu_dtype(cache) == (dtype, why)  # and trusted from then on


@pytest.mark.parametrize("text", ["not json", "[1, 2]", "\udcff".encode("utf-8", "surrogatepass").decode("latin-1")])
def test_a_damaged_cache_file_is_named_and_probed_again(tmp_path, text):
    cache = tmp_path / "cpu-dtype.json"
    cache.write_text(text, encoding="latin-1")
    with pytest.warns(UserWarning, match=f"{re.escape(str(cache))}: the file (cannot be read as JSON|holds a list)"):
        assert cpu_dtype(cache)[0] in (torch.float32, torch.bfloat16)
    assert set(json.loads(cache.read_text())) == {_probe_key(cpu_info())}


def test_a_cache_that_is_a_symlink_is_replaced_not_written_through(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes, not JSON")
    cache = tmp_path / "cpu-dtype.json"
    cache.symlink_to(mine)
    with pytest.warns(UserWarning, match="cannot be read as JSON"):
        cpu_dtype(cache)
    assert mine.read_text() == "my notes, not JSON" and not cache.is_symlink()  # was: overwritten through the link
    assert _probe_key(cpu_info()) in json.loads(cache.read_text())


def test_auto_is_bf16_on_cuda_and_resolves_through_the_probe_on_cpu():
    assert auto_dtype(torch.device("cuda"))[0] == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cpu")) == auto_dtype(torch.device("cpu"))[0]
    assert resolve_dtype("float32", torch.device("cpu")) == torch.float32


def test_cpu_info_names_the_model_and_capabilities():
    info = cpu_info()
    assert info["model"] and set(info["capabilities"]) <= set(CAPABILITIES) and info["threads"] >= 1
    assert gemm_gflops(torch.float32, size=128, seconds=0.05) > 0


def test_an_isa_limit_is_reported_and_cached_apart(tmp_path, monkeypatch):
    plain = _probe_key(cpu_info())
    machine(monkeypatch, fp32=69.0, bf16=7.5)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    info = cpu_info()
    assert info["isa_limit"] == "ONEDNN_MAX_CPU_ISA=AVX2" and _probe_key(info) != plain
    assert "kernels limited by ONEDNN_MAX_CPU_ISA=AVX2" in cpu_dtype(planted(tmp_path, fp32=69.0, bf16=7.5))[1]


@pytest.mark.skipif("avx2" not in cpu_info()["capabilities"], reason="an x86 CPU with AVX2 is needed")
def test_kernels_kept_to_avx2_choose_float32(tmp_path):
    """The rehearsal of an AVX2-only CPU: with oneDNN, ATen and MKL kept to AVX2, bf16 is emulated and the probe,
    measured afresh in a child process, chooses float32 on any x86 machine."""
    limits = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    code = "from c2llm_lib.hardware import cpu_dtype; import sys; d, why = cpu_dtype(None); print(d, why)"
    env = {**os.environ, **limits}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.startswith("torch.float32 ") and "kernels limited by ONEDNN_MAX_CPU_ISA=AVX2" in out, out


def test_measuring_the_dtype_leaves_torchs_random_stream_alone(tmp_path):
    """`dtype: auto` is resolved between a training's seed and its weights' initialisation, and how often the probe
    measures depends on the machine's load: its matrices must not come from torch's global generator, or the same seed
    initialises other weights on a busier machine."""
    import torch

    from c2llm_lib import hardware

    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    hardware.gemm_gflops(torch.float32, size=32, seconds=0.01)
    hardware.cpu_dtype(tmp_path / "cpu-dtype.json")  # a fresh probe
    hardware.cpu_dtype(tmp_path / "cpu-dtype.json")  # a cached entry, confirmed by a short measurement
    assert torch.equal(torch.rand(4), expected)
