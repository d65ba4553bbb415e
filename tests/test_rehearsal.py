"""Every shipped params file, rehearsed end to end through the notebooks it is meant for, on a CPU with no hub.

`params/overlays/rehearsal.yaml` swaps only what cannot exist here (the backbone, for the tiny random model) and
scales the sizes down; the hub datasets come from a local mirror laid out as the hub repositories
(tests/hub_mirror.py), and the release from a checkpoint folder in the released layout. Everything else runs as
shipped: bf16 where the file says so, decontamination against the MTEB(Code) test data as mteb loads it, the
checkpoints the file selects and their merge, the prompts, the evaluation settings. The params files for a user's own
data (own-code, own-pairs) get what a user names with --set from the repository's fixtures: a multi-language source
tree and a FlagEmbedding JSONL (with a BEIR set beside it), which must come out unchanged. A file that evaluates
unseen libraries (`unseen_packages`, fetched from PyPI) gets a tiny wheel written here and laid in a cache of the
test's own instead (tests/test_unseen.py), so nothing reaches the index. A params file that no
rehearsal covers fails `test_every_params_file_is_rehearsed`. metrics/train.json records the dtype `auto` resolved
to on this CPU, so a file shipping `auto` is checked for bfloat16 or float32.
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
    "default": ALL + ["07"],  # and the search of its held-out code (make run stops before 07; --only 07 runs it)
    "jina-code-0.5b": ["01", "02", "03", "04"],  # last-token pooling: no PMA attention for notebook 05
    "codexembed-style": ["01", "02", "03", "04"],
    "released-c2llm-0.5b": ["04"],  # evaluates a release; trains nothing
    "compare-recipes": ["01", "06"],
    "own-code": ["01", "02", "03", "04", "05"],  # your code: trained, evaluated on its held-out files, drawn
    "own-pairs": ["01", "02", "03", "04", "05"],  # your pairs: the same on its held-out queries
    "ablation-cpu": ["01", "06"],  # the pooling study: notebook 06 on notebook 01's rows
    "ablation-0.5b": ["01", "06"],
    "smoke": None,  # runs whole, exactly as shipped, in tests/test_pipeline.py
}
FIXTURES = REPO / "tests" / "fixtures"
# What a user names with --set for the params files that run on their own data: here the repository's fixtures,
# a multi-language source tree and a FlagEmbedding JSONL of pairs.
USER_DATA = {
    "own-code": {"code_roots": [str(FIXTURES / "own-code")]},
    "own-pairs": {"data_files": [str(FIXTURES / "own-pairs.jsonl")]},
}
# Sizes a rehearsal scales beyond the overlay, per file: a study trains every model of its grid, seeds and widths (11
# trainings with the overlay's grid), each capped here at a few steps so that the rehearsal stays near a minute. The
# paper-scale study runs the same code as the CPU one, whose rehearsal keeps the overlay's 2 seeds: one seed here
# (7 trainings).
SIZES = {"ablation-cpu": {"max_steps": 3}, "ablation-0.5b": {"max_steps": 3, "compare_seeds": [0]}}


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
def test_rehearsal(stem, mirror, release, tmp_path, monkeypatch):
    only = MEANT_FOR[stem]
    sets = {"hub_mirror": str(mirror), **USER_DATA.get(stem, {}), **SIZES.get(stem, {})}
    if shipped(stem).get("unseen_packages"):  # PyPI's wheels cannot be had here: a tiny library's, pinned the same way
        from test_unseen import tinylib_in_cache

        sets["unseen_packages"] = tinylib_in_cache(tmp_path, monkeypatch)
    if stem == "own-pairs":  # and a local retrieval set in the BEIR layout beside the held-out split
        from test_beir import write_set

        sets["beir_sets"] = [str(write_set(tmp_path / "beir" / "my-set"))]
    if "eval_released" in shipped(stem):
        sets["eval_released"] = str(release)
    before = fixtures_snapshot()
    run = run_pipeline(PARAMS / f"{stem}.yaml", only=only, sets=sets, overlay=OVERLAY, outputs=tmp_path,
                       log=lambda *_: None)  # fmt: skip
    assert fixtures_snapshot() == before  # nothing in the user's folder or file changed, nothing was added
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
    if "07" in only:
        search = json.loads((run.root / "metrics" / "search.json").read_text())
        assert search["index"]["files"] == 12 and search["summary"]["known"] == 5  # notebook 07's defaults
        assert all(q["model_rank"] for q in search["queries"])  # each expected function was indexed
    if "01" in only:
        check_data(run.root, params)
    if "03" in only:
        check_merge(run.root, params)
    if "04" in only:
        check_evaluation(run.root, params)
    if stem in USER_DATA:
        check_own_data(run.root, params["eval_limit"])
    if sets.get("beir_sets"):
        check_beir(run.root)
    if "04" in only and sets.get("unseen_packages"):
        check_unseen(run.root, sets["unseen_packages"], resolved["04_eval_mteb_code"])
    if params.get("compare_poolings"):
        check_study(run.root, resolved["06_recipe_comparison"])


def fixtures_snapshot() -> dict[str, tuple[bytes, int]]:
    """{path: (bytes, mtime_ns)} of every file and folder under tests/fixtures, links not followed."""
    return {str(p.relative_to(FIXTURES)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"",
                                           p.lstat().st_mtime_ns) for p in FIXTURES.rglob("*")}  # fmt: skip


def check_beir(root: Path) -> None:
    """The BEIR set was scored by every model beside the held-out tasks, in a table of its own stating its size."""
    scores = json.loads((root / "metrics" / "beir.json").read_text())
    assert set(scores) == set(json.loads((root / "metrics" / "eval.json").read_text()))  # the same models
    assert all(set(s) == {"beir-my-set"} for s in scores.values())
    assert json.loads((root / "metrics" / "beir_tasks.json").read_text())["beir-my-set"]["queries"] == 3
    results = (root / "metrics" / "results.md").read_text()
    table = results[results.index("### Local BEIR sets") :]
    assert "| model | beir-my-set | mean |" in table and "| *queries per task* | 3 |" in table
    assert "| *documents per task* | 4 |" in table
    assert "the training rows of C2LLM recipe (merged) were not decontaminated against beir-my-set (" in table


def check_unseen(root: Path, pins: list[str], evaluation: dict) -> None:
    """The unseen library was kept out of training (notebook 01 records its pin) and scored beside the held-out tasks,
    in a table of its own, by the trained model and BM25, and the untrained poolers on the sets `untrained_sets`
    names."""
    assert json.loads((root / "metrics" / "data.json").read_text())["unseen_packages"] == pins
    scores = json.loads((root / "metrics" / "unseen.json").read_text())
    heldout = json.loads((root / "metrics" / "eval.json").read_text())
    untrained = {m for m in {*scores, *heldout} if m.startswith("untrained")}
    assert untrained == {f"untrained, {p} pooling" for p in evaluation["baselines"] if p != "bm25"}
    for found, name in ((scores, "unseen"), (heldout, "heldout")):
        assert set(found) - untrained == {"C2LLM recipe (merged)", "BM25"}
        assert set(found) >= untrained if name in evaluation["untrained_sets"] else not set(found) & untrained
    assert all(set(s) == {"unseen-text2code-tinylib", "unseen-code2code-tinylib"} for s in scores.values())
    assert "### Unseen libraries, nDCG@10 x 100" in (root / "metrics" / "results.md").read_text()


def check_own_data(root: Path, eval_limit: int) -> None:
    """A run on the user's own data saved its held-out split, was evaluated on it (one task per dataset and
    language, no HumanEval), every table stating each task's queries and documents, and drew attention over it."""
    from datasets import load_from_disk

    from c2llm_lib.eval.tasks import heldout_task_names

    heldout = load_from_disk(str(root / "data" / "heldout"))
    data = json.loads((root / "metrics" / "data.json").read_text())
    assert data["heldout_rows"] == len(heldout) > 0
    names = heldout_task_names(zip(heldout["dataset"], heldout["language"], strict=True))
    sizes = json.loads((root / "metrics" / "eval_tasks.json").read_text())
    assert sorted(sizes) == sorted(names.values()) and "HumanEval" not in sizes
    for name, counts in sizes.items():
        group = [r for r in heldout if names[(r["dataset"], r["language"])] == name]
        assert counts["documents"] == len({r["positive"] for r in group})  # every held-out document of the group
        assert counts["queries"] == min(len({r["query"] for r in group}), eval_limit)  # each distinct query once
    lines = (root / "metrics" / "results.md").read_text().split("### Local BEIR sets")[0].splitlines()
    assert "on the run's own held-out split" in lines[0]
    columns = [c.strip() for c in lines[2].strip("|").split("|")][1:]
    assert sorted(columns[:-1]) == sorted(sizes) and columns[-1] == "mean"
    for count in ("queries", "documents"):
        (row,) = [line for line in lines if line.startswith(f"| *{count} per task* |")]
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        split = {t: sizes[t].get("queries in the split") if count == "queries" else None for t in columns[:-1]}
        drawn = {t: f" of {n}" if n is not None else "" for t, n in split.items()}  # eval_limit drew them: "3 of 7"
        assert cells[: len(sizes)] == [f"{sizes[task][count]}{drawn[task]}" for task in columns[:-1]]
    attention = json.loads((root / "metrics" / "attention.json").read_text())
    assert set(attention["corpus_languages"]) <= set(heldout["language"]) and attention["category_texts"]


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
        assert data["sources"][source]["passed_checks"] == 10 and data["sources"][source]["kept"] == 8
    # CodeEditSearch: mteb evaluates its first 1,000 train rows, so only the rows past them may train
    assert data["sources"]["CodeEditSearchRetrieval"]["kept"] == CODE_EDIT_EXTRA
    assert sum(s["kept"] for s in data["sources"].values()) == data["rows"]  # kept: the rows that train


def check_merge(root: Path, params: dict) -> None:
    train = json.loads((root / "metrics" / "train.json").read_text())
    merge = json.loads((root / "metrics" / "merge.json").read_text())
    listed = [Path(c).name for c in train["checkpoints"]]
    merged = [Path(c).name for c in merge["checkpoints"]]
    assert merged == listed[-params.get("merge_last", 4) :]
    assert merged[-1] == f"step-{train['steps']:06d}"  # the merge ends at the final step
    if params.get("checkpoint_fractions"):  # the paper's four checkpoints, late in training, evenly spaced
        assert len(merged) == params["merge_last"] == len(params["checkpoint_fractions"])
    assert train["dtype_asked"] == params.get("dtype", "auto")  # as shipped, bf16 where the file says so...
    resolved = train["model_config"]["dtype"]  # ...recorded as the dtype the training resolved, never "auto"
    assert resolved == params["dtype"] if params.get("dtype", "auto") != "auto" else resolved in ("bfloat16", "float32")


def check_evaluation(root: Path, params: dict) -> None:
    evaluation = json.loads((root / "metrics" / "eval.json").read_text())
    assert evaluation and all(0 <= v <= 1 for model in evaluation.values() for v in model.values())
    if params.get("mteb_tasks"):
        benchmark = (root / "metrics" / "mteb_code.md").read_text()
        for task in ("AppsRetrieval", "CodeEditSearchRetrieval", "SyntheticText2SQL"):
            assert task in benchmark


def test_the_overlay_is_validated_with_the_runs_sets():
    """A params file that needs a --set to be valid (your folder or file) takes the overlay: the sets take part in
    the overlay's validation, and are laid over it afterwards, as on the command line."""
    from c2llm_lib.checks import ConfigError
    from c2llm_lib.params import apply_overlay, load_params

    for stem, sets in USER_DATA.items():
        merged = apply_overlay(load_params(PARAMS / f"{stem}.yaml"), OVERLAY, sets=sets)
        assert merged["backbone"] == "tiny-random-qwen2" and not set(sets) & set(merged)
        with pytest.raises(ConfigError, match=f"{next(iter(sets))}' must name at least one"):
            apply_overlay(load_params(PARAMS / f"{stem}.yaml"), OVERLAY)


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
    selected = {t["folder"] for t in study["setting"]["selected on validation"]}
    tested = {t["folder"] for t in study["setting"]["scored on test"]}
    assert selected and tested and not selected & tested  # no test score from a training chosen on validation
    assert {t["seed"] for t in study["setting"]["selected on validation"]} == {study["setting"]["sweep seed"]}
    if len(seeds) > 1:  # the intervals over trainings, beside those over queries
        over = {(d["a"], d["b"]): d["intervals"]["mean"] for d in study["differences over trainings"]}
        assert set(over) == pairs and all(i["trainings"] == [len(seeds)] * 2 for i in over.values())
    text = (root / "metrics" / "pooling_study.md").read_text()
    assert "95 % interval" in text and "Rates chosen on the validation split" in text
    assert (root / "figures" / "pooling_study.png").stat().st_size > 1000
