"""Shared fixtures. Tests run offline: every hub access is disabled before transformers is imported."""

import os
import shutil
import tempfile
from pathlib import Path

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_var] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist each worker (and every kernel and training it starts) computes on its share of the cores: two
# workers each asking for every core would oversubscribe them. Set before torch is imported; a value set by hand wins.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

import pytest  # noqa: E402
import torch  # noqa: E402

from c2llm_lib import C2LLMEncoder, ModelConfig  # noqa: E402
from c2llm_lib.model import TINY_BACKBONE  # noqa: E402

# tests/fixtures holds source trees that tests read as data (own-code/ has test files of its own, and a file that
# does not parse on purpose): never collected as tests.
collect_ignore = ["fixtures"]

# `make test` runs the suite on 2 workers (pytest-xdist, `-n 2`), scheduled here. A test file runs whole on one worker:
# its module fixtures are built once, and the tests that start trainings, kill processes, bind a port or count children
# never meet a test of their own file (every test keeps its own tmp_path, so no two share a run). The rehearsals,
# independent runs with cheap fixtures and 40 % of the suite's time, go one by one to whichever worker is free.
SPREAD = {"test_rehearsal"}
SAME_WORKER = {"test_browser": "test_search"}  # notebook 07's tests share the session's smoke run (`smoke_merged`)


def worker_scope(nodeid: str) -> str:
    """The unit of work a worker takes whole: the test's file, the test itself for a rehearsal."""
    stem = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return nodeid if stem in SPREAD else SAME_WORKER.get(stem, stem)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: defined only where pytest-xdist is installed
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_scope(nodeid)

    return ByFile(config, log)


# The free space the whole suite asks of its temporary folder's filesystem: its temporary files (trainings,
# checkpoints, mirrors, exports) peaked at 1.2 GiB in a fresh clone on 2 workers (docs/tests.md). Below it the suite
# would fail in scattered setups with "No space left on device"; it stops before the first test instead, saying so.
SUITE_DISK_GIB = 3.0
# options that narrow a run or run no test: such a run is not checked
NARROWING = ("keyword", "markexpr", "deselect", "lf", "collectonly", "showfixtures", "show_fixtures_per_test")


def disk_shortfall(folder: Path, need_bytes: int) -> str:
    """Why the filesystem under `folder` cannot hold the suite's temporary files ('' when it can)."""
    existing = Path(os.path.abspath(folder))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free >= need_bytes:
        return ""
    return (f"the test suite needs {need_bytes / 2**30:.1f} GiB free for its temporary files under {folder}, and its "
            f"filesystem has {free / 2**30:.1f} GiB: free space there, point TMPDIR at a filesystem with room, or name "
            "the tests to run a part of the suite")  # fmt: skip


def pytest_sessionstart(session):
    """The whole suite (run without paths or options that narrow it, as `make test` and CI run it) first checks its
    room on disk; an xdist worker leaves that to the process that started it."""
    config = session.config
    if hasattr(config, "workerinput") or config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return
    if any(getattr(config.option, name, None) for name in NARROWING):
        return
    folder = Path(config.option.basetemp or tempfile.gettempdir())
    why = disk_shortfall(folder, int(SUITE_DISK_GIB * 2**30))
    if why:
        pytest.exit(why, returncode=pytest.ExitCode.USAGE_ERROR)


CUDA = torch.cuda.is_available()


def requires_cuda(test):
    """Marks a test `gpu` (what `pytest -m gpu` and `make gpu-check` select) and skips it without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(not CUDA, reason="needs CUDA")(test))


def build_tiny(seed: int = 0, **overrides) -> C2LLMEncoder:
    """A tiny random encoder (2-layer Qwen2, real Qwen2.5 tokenizer) on the CPU, without LoRA unless the overrides ask
    for it (`TINY_LORA`)."""
    values = {"backbone": TINY_BACKBONE, "device": "cpu", "dtype": "float32", "use_lora": False, **overrides}
    torch.manual_seed(seed)  # the PMA head's and LoRA's initialisation
    return C2LLMEncoder.from_config(ModelConfig(**values))


TINY_LORA = {"use_lora": True, "lora_r": 4, "lora_alpha": 8, "pma_heads": 4}


@pytest.fixture
def make_encoder():
    return build_tiny


def randomize_lora(encoder: C2LLMEncoder, seed: int = 1) -> None:
    """LoRA's B starts at zero (a no-op adapter); give it values so that tests can see the adapter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in encoder.backbone.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)


def right_pad(batch: dict[str, torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
    """The same rows as a left-padded batch, padded on the right instead."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    new_ids, new_mask = torch.full_like(ids, pad_id), torch.zeros_like(mask)
    for i in range(ids.shape[0]):
        n = int(mask[i].sum())
        if n:
            new_ids[i, :n] = ids[i, ids.shape[1] - n :]
            new_mask[i, :n] = 1
    return {"input_ids": new_ids, "attention_mask": new_mask}


@pytest.fixture(scope="session")
def smoke_merged(tmp_path_factory):
    """An outputs folder holding the smoke run through notebook 03 (data, checkpoints, merged model): what notebook 07
    needs, shared by its pipeline and browser tests."""
    from c2llm_lib.pipeline import run_pipeline

    outputs = tmp_path_factory.mktemp("smoke-outputs")
    smoke = Path(__file__).resolve().parent.parent / "params" / "smoke.yaml"
    run_pipeline(smoke, only=["01", "02", "03"], outputs=outputs, log=lambda *_: None)
    return outputs
