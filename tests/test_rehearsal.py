"""Every shipped params file, rehearsed end to end through the notebooks it is meant for, on a CPU with no hub.

`params/overlays/rehearsal.yaml` swaps only what cannot exist here (the backbone, for the tiny random model) and
scales the sizes down; the hub datasets come from a local mirror laid out as the hub repositories
(tests/hub_mirror.py), and the release from a checkpoint folder in the released layout. Everything else runs as
shipped: bf16 where the file says so, decontamination against the MTEB(Code) test data as mteb loads it, the
checkpoints the file selects and their merge, the prompts, the evaluation settings. A params file that no rehearsal
covers fails `test_every_params_file_is_rehearsed`.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
import yaml

from c2llm_lib.pipeline import run_pipeline

from hub_mirror import CODE_EDIT_EXTRA, write_mirror
from released_fixture import write_tiny_release

REPO = Path(__file__).resolve().parent.parent
PARAMS = REPO / "params"
OVERLAY = PARAMS / "overlays" / "rehearsal.yaml"
ALL = ["01", "02", "03", "04", "05", "06"]
# The notebooks each shipped params file is meant for (its header comment says the same to users).
MEANT_FOR = {
    "c2llm-0.5b": ALL,
    "c2llm-7b": ALL,
    "default": ALL,
    "jina-code-0.5b": ["01", "02", "03", "04"],  # last-token pooling: no PMA attention for notebook 05
    "codexembed-style": ["01", "02", "03", "04"],
    "released-c2llm-0.5b": ["04"],  # evaluates a release; trains nothing
    "compare-recipes": ["01", "06"],
    "ablation-cpu": ["01", "06"],  # the pooling study: notebook 06 on notebook 01's rows
    "ablation-0.5b": ["01", "06"],
    "smoke": None,  # runs whole, exactly as shipped, in tests/test_pipeline.py
}
# Sizes a rehearsal scales beyond the overlay, per file: a study trains every model of its grid, seeds and widths (11
# trainings with the overlay's grid), each capped here at a few steps so that the rehearsal stays near a minute.
SIZES = {"ablation-cpu": {"max_steps": 3}, "ablation-0.5b": {"max_steps": 3}}


def test_every_params_file_is_rehearsed():
    shipped = {p.stem for p in PARAMS.glob("*.yaml")}
    assert shipped == set(MEANT_FOR), f"add a rehearsal for {sorted(shipped - set(MEANT_FOR))} to MEANT_FOR"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    return write_mirror(tmp_path_factory.mktemp("hub-mirror"))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_tiny_release(tmp_path_factory.mktemp("release") / "C2LLM-0.5B")


def executed_without_error(run_root: Path, only: list[str]) -> None:
    for path in sorted((run_root / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
        assert nb.metadata.papermill["exception"] is None and not errors, path.name
    assert len(list((run_root / "notebooks").glob("*.ipynb"))) == len(only)


def shipped(stem: str) -> dict:
    return yaml.safe_load((PARAMS / f"{stem}.yaml").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("stem", [s for s, only in MEANT_FOR.items() if only], ids=str)
def test_rehearsal(stem, mirror, release, tmp_path):
    only = MEANT_FOR[stem]
    sets = {"hub_mirror": str(mirror), **SIZES.get(stem, {})}
    if "eval_released" in shipped(stem):
        sets["eval_released"] = str(release)
    run = run_pipeline(PARAMS / f"{stem}.yaml", only=only, sets=sets, overlay=OVERLAY, outputs=tmp_path,
                       log=lambda *_: None)  # fmt: skip
    executed_without_error(run.root, only)
    manifest = json.loads((run.root / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["overlay"].endswith("rehearsal.yaml")
    resolved = yaml.safe_load((run.root / "resolved.yaml").read_text())
    params = shipped(stem)
    for notebook, values in resolved.items():  # as shipped, but for the overlay's swaps and sizes
        overlay = yaml.safe_load(OVERLAY.read_text())
        swapped = set(overlay) | set(overlay["where_nonempty"]) | set(sets)
        for key, value in params.items():
            if key in values and key not in swapped:
                assert values[key] == value, (notebook, key)
    if "01" in only:
        check_data(run.root, params)
    if "03" in only:
        check_merge(run.root, params)
    if "04" in only:
        check_evaluation(run.root, params)
    if params.get("compare_poolings"):
        check_study(run.root, resolved["06_recipe_comparison"])


def check_data(root: Path, params: dict) -> None:
    data = json.loads((root / "metrics" / "data.json").read_text())
    assert data["rows"] > 0
    if params.get("data_source") != "hub":
        return
    dropped = data["decontaminated"]
    # the mirror plants, in every CoIR (sub)set, one training query that is a test query and one training positive
    # that is a relevant test document: exactly those are dropped, and the other training rows are kept
    for source in ("AppsRetrieval", "CosQA", "SyntheticText2SQL"):
        assert sum(dropped[source].values()) == 2, (source, dropped[source])
        assert data["sources"][source]["kept"] == 10
    # CodeEditSearch: mteb evaluates its first 1,000 train rows, so only the rows past them may train
    assert data["sources"]["CodeEditSearchRetrieval"]["kept"] - sum(dropped["CodeEditSearchRetrieval"].values()) == (
        CODE_EDIT_EXTRA
    )


def check_merge(root: Path, params: dict) -> None:
    train = json.loads((root / "metrics" / "train.json").read_text())
    merge = json.loads((root / "metrics" / "merge.json").read_text())
    listed = [Path(c).name for c in train["checkpoints"]]
    merged = [Path(c).name for c in merge["checkpoints"]]
    assert merged == listed[-params.get("merge_last", 4) :]
    assert merged[-1] == f"step-{train['steps']:06d}"  # the merge ends at the final step
    if params.get("checkpoint_fractions"):  # the paper's four checkpoints, late in training, evenly spaced
        assert len(merged) == params["merge_last"] == len(params["checkpoint_fractions"])
    assert train["model_config"]["dtype"] == params.get("dtype", "auto")


def check_evaluation(root: Path, params: dict) -> None:
    evaluation = json.loads((root / "metrics" / "eval.json").read_text())
    assert evaluation and all(0 <= v <= 1 for model in evaluation.values() for v in model.values())
    if params.get("mteb_tasks"):
        benchmark = (root / "metrics" / "mteb_code.md").read_text()
        for task in ("AppsRetrieval", "CodeEditSearchRetrieval", "SyntheticText2SQL"):
            assert task in benchmark


def check_study(root: Path, params: dict) -> None:
    """The pooling study ran whole: every pooler chosen on validation and trained with every seed, PMA projected to
    each width, every difference with its interval, the figure, and the setting a publication needs."""
    study = json.loads((root / "metrics" / "pooling_study.json").read_text())
    seeds, dims = params["compare_seeds"], params["compare_pma_dims"]
    poolers = {"pma": "PMA", "last_token": "last token", "mean": "mean"}
    assert set(study["poolers"]) == {poolers[p] for p in params["compare_poolings"]}
    assert set(study["sweeps"]) == set(study["poolers"])
    assert all(len(model["seeds"]) == len(seeds) for model in study["models"].values())
    assert {f"PMA d={d}" for d in dims} <= set(study["models"])
    pairs = {(d["a"], d["b"]) for d in study["differences"]}
    assert ("PMA", "last token") in pairs and ("PMA", "mean") in pairs
    assert all({"value", "low", "high", "within_noise"} <= set(i) for d in study["differences"]
               for i in d["intervals"].values())  # fmt: skip
    assert study["setting"]["cpu"]["model"] and study["setting"]["timings"] and study["setting"]["validation"]
    text = (root / "metrics" / "pooling_study.md").read_text()
    assert "95 % interval" in text and "Rates chosen on the validation split" in text
    assert (root / "figures" / "pooling_study.png").stat().st_size > 1000
