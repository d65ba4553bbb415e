"""Every params file validates against the notebooks' parameters and stage dataclasses."""

from pathlib import Path

import pytest

from c2llm_lib.pipeline import load_params, resolve

PARAMS = sorted((Path(__file__).resolve().parent.parent / "params").glob("*.yaml"))


def test_the_expected_params_files_exist():
    assert {p.stem for p in PARAMS} >= {"default", "smoke", "c2llm-0.5b", "c2llm-7b"}


@pytest.mark.parametrize("path", PARAMS, ids=lambda p: p.stem)
def test_params_file_validates(path):
    resolved = resolve(load_params(path), str(path))
    assert set(resolved) == {"01_data_prep", "02_train_lora_contrastive", "03_merge_checkpoints",
                             "04_eval_mteb_code", "05_pma_attention"}  # fmt: skip
    train = resolved["02_train_lora_contrastive"]
    assert resolved["01_data_prep"]["num_negatives"] == train["num_negatives"]  # one K for mining and training
    if path.stem.startswith("c2llm-"):  # the paper's recipe (section 4.1)
        assert (train["lora_r"], train["lora_alpha"], train["learning_rate"], train["tau"]) == (64, 32, 1e-4, 0.05)
        assert (train["max_length"], train["epochs"], train["num_negatives"], train["pma_heads"]) == (1024, 3, 7, 32)
        assert resolved["03_merge_checkpoints"]["merge_last"] == 4
