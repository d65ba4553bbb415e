"""Params resolution (c2llm_lib/params.py): every params file validates against the notebooks' parameters and stage
dataclasses; a bad file, overlay or value is refused, blamed on where it came from."""

import math
from pathlib import Path

import pytest

from c2llm_lib.checks import ConfigError
from c2llm_lib.model.backbone import tiny_qwen2_config
from c2llm_lib.notebook import NOTEBOOK_DIR
from c2llm_lib.params import HIDDEN_SIZES, apply_overlay, load_params, parse_sets, resolve, resolve_run
from c2llm_lib.study.plan import plan
from c2llm_lib.train import split_params

PARAMS_DIR = Path(__file__).resolve().parent.parent / "params"
PARAMS = sorted(PARAMS_DIR.glob("*.yaml"))
FIXTURES = PARAMS_DIR.parent / "tests" / "fixtures"
# the params files that run on a folder or file of the user's, named with --set (the rehearsal's fixtures here)
USERS = {"own-code": {"code_roots": [str(FIXTURES / "own-code")]},
         "own-pairs": {"data_files": [str(FIXTURES / "own-pairs.jsonl")]}}  # fmt: skip


def test_the_expected_params_files_exist():
    assert {p.stem for p in PARAMS} >= {"default", "smoke", "c2llm-0.5b", "c2llm-7b", "jina-code-0.5b",
                                        "codexembed-style", "compare-recipes"}  # fmt: skip


@pytest.mark.parametrize("path", PARAMS, ids=lambda p: p.stem)
def test_params_file_validates(path):
    resolved = resolve({**load_params(path), **USERS.get(path.stem, {})}, str(path))
    assert set(resolved) == {"01_data_prep", "02_train_lora_contrastive", "03_merge_checkpoints",
                             "04_eval_mteb_code", "05_pma_attention", "06_recipe_comparison",
                             "07_search_code"}  # fmt: skip
    train = resolved["02_train_lora_contrastive"]
    assert resolved["01_data_prep"]["num_negatives"] == train["num_negatives"]  # one K for mining and training
    if path.stem.startswith("c2llm-"):  # the paper's recipe (section 4.1)
        assert (train["lora_r"], train["lora_alpha"], train["learning_rate"], train["tau"]) == (64, 32, 1e-4, 0.05)
        assert (train["max_length"], train["epochs"], train["num_negatives"], train["pma_heads"]) == (1024, 3, 7, 32)
        assert resolved["03_merge_checkpoints"]["merge_last"] == 4
    compare = resolved["06_recipe_comparison"]
    if compare["compare_recipes"]:  # every recipe it names is a params file whose recipe fits this run's compute
        keys = {k: v for k, v in resolved["02_train_lora_contrastive"].items() if k not in ("run", "outputs_dir")}
        model, train = split_params(keys, str(path))
        entries = plan(model, train, compare["compare_recipes"], compare["compare_dims"], compare["compare_pma_dims"])
        assert {e.recipe for e in entries} == set(compare["compare_recipes"])


def test_the_peer_recipes_are_their_papers():
    jina = resolve(load_params(PARAMS_DIR / "jina-code-0.5b.yaml"), "jina")["02_train_lora_contrastive"]
    assert (jina["backbone"], jina["pooling"], jina["prompt_style"]) == (
        "Qwen/Qwen2.5-Coder-0.5B",
        "last_token",
        "jina",
    )
    assert (jina["tau"], jina["max_length"], jina["num_negatives"], jina["global_batch_size"]) == (0.05, 512, 0, 512)
    assert jina["mrl_dims"] == [512, 256, 128, 64] and jina["max_steps"] == 1500
    codex = resolve(load_params(PARAMS_DIR / "codexembed-style.yaml"), "codex")["02_train_lora_contrastive"]
    assert (codex["pooling"], codex["prompt_style"], codex["lora_r"], codex["num_negatives"]) == (
        "last_token", "codexembed", 8, 7)  # fmt: skip
    assert (codex["learning_rate"], codex["lr_schedule"], codex["warmup_steps"], codex["grad_cache"]) == (
        5e-5, "linear", 50, True)  # fmt: skip
    assert codex["learning_rate"] * codex["min_lr_ratio"] == pytest.approx(5e-6)
    assert codex["global_batch_size"] == 1024 and not codex["mrl_dims"]


@pytest.mark.parametrize("stem", USERS)
def test_a_params_file_for_your_own_data_names_the_key_to_set(stem, tmp_path, capsys):
    from c2llm_lib.pipeline import main

    (key,) = USERS[stem]
    text = (PARAMS_DIR / f"{stem}.yaml").read_text()
    assert f"--set {key}=[" in text and f"# {key}: [" in text  # the header says how to point it at yours
    assert main([str(PARAMS_DIR / f"{stem}.yaml"), "--outputs", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert f"parameter {key!r} must name at least one" in error and f"e.g. --set {key}=[/path/to/" in error
    assert not any(tmp_path.iterdir())  # refused before a run directory was made


def test_the_pooling_studies_plan_every_pooler_and_width():
    """ablation-cpu.yaml is the default's compute; ablation-0.5b.yaml the paper's recipe and scale (section 4.1); both
    run the same study: the three poolers at their own chosen rates, swept at a seed of their own and then trained
    with 3 others, PMA projected to 128 (the CPU study) or to 512, 256 and 128 (the paper-scale one)."""
    projected = {"ablation-cpu": ["PMA d=128"], "ablation-0.5b": ["PMA d=512", "PMA d=256", "PMA d=128"]}
    for stem in ("ablation-cpu", "ablation-0.5b"):
        resolved = resolve(load_params(PARAMS_DIR / f"{stem}.yaml"), stem)
        keys = {k: v for k, v in resolved["02_train_lora_contrastive"].items() if k not in ("run", "outputs_dir")}
        model, train = split_params(keys, stem)
        study = resolved["06_recipe_comparison"]
        assert study["compare_sweep"] and study["compare_seeds"] == [0, 1, 2]
        assert study["sweep_seed"] not in study["compare_seeds"]
        entries = plan(model, train, study["compare_recipes"], study["compare_dims"], study["compare_pma_dims"],
                       poolings=study["compare_poolings"])  # fmt: skip
        assert [e.label for e in entries] == ["PMA", *projected[stem], "last token", "mean"]
    default = resolve(load_params(PARAMS_DIR / "default.yaml"), "default")["02_train_lora_contrastive"]
    cpu = resolve(load_params(PARAMS_DIR / "ablation-cpu.yaml"), "cpu")["02_train_lora_contrastive"]
    same = ("backbone", "dtype", "max_length", "num_negatives", "global_batch_size", "grad_cache", "grad_cache_chunk",
            "lora_compute", "lora_r", "lora_alpha")  # fmt: skip
    assert {k: cpu[k] for k in same} == {k: default[k] for k in same}
    paper = resolve(load_params(PARAMS_DIR / "ablation-0.5b.yaml"), "gpu")
    train = paper["02_train_lora_contrastive"]
    assert (train["max_length"], train["epochs"], train["num_negatives"], train["max_steps"]) == (1024, 3, 7, None)
    assert (train["lora_r"], train["lora_alpha"], train["global_batch_size"]) == (64, 32, 256)
    assert paper["01_data_prep"]["data_source"] == "hub" and paper["01_data_prep"]["decontaminate_mteb"]


PARAMS_FILES = [  # text of a params file, and the error it must give (None: it loads)
    ("", "holds no parameters"),
    ("# only a comment\n", "holds no parameters"),
    ("tau: 0.05\nseed: 1\ntau: 0.1\n", r"the key 'tau' is given twice \(lines 1 and 3\)"),
    ("loss_weights: {CosQA: 1.0, CosQA: 2.0}\n", "the key 'CosQA' is given twice"),
    ("learning_rate: [1, 2\n", "does not parse as YAML"),
]


@pytest.mark.parametrize("text,message", PARAMS_FILES)
def test_a_bad_params_file_is_refused(tmp_path, text, message):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"p.yaml: {message}"):
        load_params(path)


NUMBERS = [("1e-3", 1e-3), ("5E4", 5e4), ("1.0e5", 1e5), ("-2e-4", -2e-4), ("+3e2", 300.0), ("1.5e-3", 1.5e-3),
           ("0.0001", 1e-4), ("3", 3), ("1e3x", "1e3x"), (".inf", math.inf)]  # fmt: skip


@pytest.mark.parametrize("text,value", NUMBERS)
def test_exponent_numbers_read_as_floats_in_files_and_sets(tmp_path, text, value):
    path = tmp_path / "p.yaml"
    path.write_text(f"learning_rate: {text}\n")
    for got in (load_params(path)["learning_rate"], parse_sets([f"learning_rate={text}"])["learning_rate"]):
        assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    "params,conditional,message",
    [
        ({}, "max_length: 64", r"where_nonempty names 'max_length', which is not a list parameter \(here it is 1024\)"),
        ({}, "merge_last: 2", r"where_nonempty names 'merge_last', which is not a list parameter"),
        ({"mrl_dims": [64]}, "mrl_dims: 32", r"where_nonempty gives 'mrl_dims' the value 32; .* give a list"),
        ({}, "mrl_dims: 32", r"where_nonempty gives 'mrl_dims' the value 32"),  # refused even where nothing asks
    ],
)
def test_an_overlay_condition_that_would_be_ignored_is_refused(tmp_path, params, conditional, message):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(f"seed: 1\nwhere_nonempty:\n  {conditional}\n")
    with pytest.raises(ConfigError, match=f"overlay.yaml: {message}"):  # was: ignored, or blamed on the params file
        apply_overlay(params, overlay)


def test_an_overlay_condition_on_a_list_applies_where_the_run_has_one(tmp_path):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("seed: 1\nwhere_nonempty:\n  mrl_dims: [32]\n  merge_weights: [1.0]\n")
    assert apply_overlay({"mrl_dims": [64]}, overlay) == {"mrl_dims": [32], "seed": 1}  # merge_weights: None here
    # an overlay that swaps in a small backbone and scales the study's PMA widths down: only the result is checked
    overlay.write_text("backbone: tiny-random-qwen2\nwhere_nonempty:\n  compare_pma_dims: [32]\n")
    study = {"compare_poolings": ["pma"], "compare_dims": [512, 256, 32], "compare_pma_dims": [512, 256]}
    merged = apply_overlay(study, overlay)
    assert resolve(merged, "p.yaml")["06_recipe_comparison"]["compare_pma_dims"] == [32]


BLAME = [  # params file, overlay, --set values, and where the error must say the bad value came from
    ("learning_rate: 7\n", "seed: 1\n", {}, "p.yaml (notebook 02_train_lora_contrastive): parameter 'learning_rate'"),
    ("lerning_rate: 1\n", "seed: 1\n", {}, "p.yaml: no notebook declares 'lerning_rate'"),
    ("seed: 1\n", "learning_rate: 7\n", {}, "o.yaml (notebook 02_train_lora_contrastive): parameter 'learning_rate'"),
    ("seed: 1\n", "seed: 2\n", {"learning_rate": 7}, "--set (notebook 02_train_lora_contrastive): parameter "
     "'learning_rate'"),
    ("seed: 1\n", None, {"learning_rate": 7}, "--set (notebook 02_train_lora_contrastive): parameter 'learning_rate'"),
    ("compare_poolings: [pma]\ncompare_dims: [128, 7]\n", "where_nonempty:\n  compare_pma_dims: [7]\n", {},
     "o.yaml: compare_pma_dims [7] (notebook 06)"),
    ("seed: 1\n", None, {"hub_mirror": "/no/such/mirror"}, "--set (notebook 01_data_prep): hub_mirror '/no/such/"),
]  # fmt: skip


@pytest.mark.parametrize("text,overlay,sets,message", BLAME)
def test_a_bad_value_is_blamed_on_where_it_came_from(tmp_path, text, overlay, sets, message):
    """An overlay's bad value was blamed on the params file after its where_nonempty, and with an overlay a bad value of
    the params file or of --set was blamed on the overlay, without one a --set value on the params file."""
    params = tmp_path / "p.yaml"
    params.write_text(text)
    if overlay is not None:
        (tmp_path / "o.yaml").write_text(overlay)
    with pytest.raises(ConfigError) as refused:
        resolve_run(params, sets, tmp_path / "o.yaml" if overlay is not None else None)
    assert str(refused.value).removeprefix(f"{tmp_path}/").startswith(message), str(refused.value)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"compare_pma_dims": [3], "compare_dims": [3]},
         r"compare_pma_dims \[3\] \(notebook 06\) must be multiples of pma_heads = 32"),
        ({"backbone": "tiny-random-qwen2", "pma_heads": 4, "compare_pma_dims": [32, 128], "compare_dims": [32, 128]},
         r"compare_pma_dims \[128\] \(notebook 06\) are wider than the backbone's hidden size 64 \(tiny-random-qwen"),
        ({"backbone": "Qwen/Qwen2.5-Coder-0.5B-Instruct", "compare_pma_dims": [1024, 512], "compare_dims": [1024, 512]},
         r"compare_pma_dims \[1024\] .* 896"),
    ],
)  # fmt: skip
def test_pma_dims_that_the_pooling_study_cannot_train_are_refused_before_anything_runs(overrides, message):
    """ablation_dims [3] failed inside notebook 04, after the whole evaluation; the pooling study's widths, which
    replace them, are checked before anything runs."""
    with pytest.raises(ConfigError, match=f"p.yaml: {message}"):
        resolve({"compare_poolings": ["pma", "mean"], **overrides}, "p.yaml")
    resolve({"compare_poolings": ["mean"], **overrides}, "p.yaml")  # no PMA trained: not checked


def test_pma_dims_against_a_local_backbones_config(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"hidden_size": 48}')
    base = {
        "compare_poolings": ["pma"],
        "backbone": str(tmp_path / "model"),
        "pma_heads": 4,
        "compare_dims": [64, 48, 16],
    }
    with pytest.raises(ConfigError, match=r"compare_pma_dims \[64\] .* hidden size 48"):
        resolve({**base, "compare_pma_dims": [64, 16]}, "p.yaml")
    resolved = resolve({**base, "compare_pma_dims": [48, 16]}, "p.yaml")
    assert resolved["06_recipe_comparison"]["compare_pma_dims"] == [48, 16]
    (tmp_path / "model" / "config.json").write_text("[1, 2]")  # unreadable here: the loader will say, not resolve
    resolve({**base, "compare_pma_dims": [64]}, "p.yaml")


@pytest.mark.parametrize("key,replacement", [("ablations", "compare_poolings"), ("ablation_dims", "compare_pma_dims")])
def test_a_moved_key_names_its_replacement(key, replacement):
    """notebook 04's quick pooling ablation gave way to notebook 06's pooling study: a params file that still sets its
    keys is refused with what replaced them, not only "no notebook declares"."""
    with pytest.raises(ConfigError, match=rf"p.yaml: no notebook declares '{key}' \(moved: .*{replacement}"):
        resolve({key: True if key == "ablations" else [128]}, "p.yaml")
    assert HIDDEN_SIZES["tiny-random-qwen2"] == tiny_qwen2_config().hidden_size


def test_a_relative_folder_is_checked_where_the_notebooks_run(tmp_path, monkeypatch):
    """Notebooks run in notebooks/: a hub_mirror or backbone relative to where the runner started named another
    folder, and failed inside a notebook without saying from where it was resolved."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mirror").mkdir()
    (tmp_path / "models" / "mine").mkdir(parents=True)
    with pytest.raises(
        ConfigError,
        match=rf"p.yaml \(notebook 01_data_prep\): hub_mirror 'mirror' is relative, and "
        rf"the notebooks run in notebooks/, where it names {NOTEBOOK_DIR / 'mirror'}, which is not a "
        rf"folder; it exists from here \({tmp_path}\): give its absolute path, {tmp_path / 'mirror'}",
    ):
        resolve({"hub_mirror": "mirror"}, "p.yaml")  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"\(notebook 02_train_lora_contrastive\): backbone 'models/mine' is relative"
    ):
        resolve({"backbone": "models/mine"}, "p.yaml")
    with pytest.raises(ConfigError, match=r"backbone './nowhere' is relative.* which is not a folder$"):
        resolve({"backbone": "./nowhere"}, "p.yaml")
    with pytest.raises(ConfigError, match=rf"hub_mirror '{tmp_path / 'gone'}' is not a folder"):
        resolve({"hub_mirror": str(tmp_path / "gone")}, "p.yaml")
    resolve({"hub_mirror": str(tmp_path / "mirror"), "backbone": str(tmp_path / "models" / "mine")}, "p.yaml")
    resolve({"backbone": "Qwen/Qwen2.5-Coder-0.5B-Instruct"}, "p.yaml")  # a hub id, not a folder
