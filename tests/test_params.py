"""Every params file validates against the notebooks' parameters and stage dataclasses."""

from pathlib import Path

import pytest

from c2llm_lib.comparison import plan
from c2llm_lib.params import load_params, resolve
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
