"""The export folder: sentence-transformers and plain transformers give `C2LLMEncoder.encode`'s embeddings, with the
prompts of mteb's registration; the model card's loader is run from the card itself."""

import json

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from c2llm_lib.export import loader_from_card, model_card, save_export, sentence_prompts
from c2llm_lib.prompts import C2LLM_PROMPTS

pytestmark = pytest.mark.slow  # three tiny exports, loaded several ways (about a minute on 2 cores)

MAX_LENGTH = 24  # short, so that the long texts below are cut
TEXTS = [
    "def add(a, b):\n    return a + b",
    "read a json file",
    "",  # no token at all for a query without instruction
    "x = 1\n" * 40,  # cut at MAX_LENGTH
    "función que suma números ✓ — 数字",
    "   leading and trailing spaces   ",
]
PROMPTS = [  # (prompt name, C2LLMEncoder.encode arguments)
    ("query", {"kind": "query"}),
    ("document", {"kind": "document"}),
    ("CodeSearchNetRetrieval-query", {"kind": "query", "instruction": C2LLM_PROMPTS["CodeSearchNetRetrieval"]}),
    ("AppsRetrieval-document", {"kind": "document"}),
]
POOLINGS = [
    {"pooling": "pma", "pma_heads": 4},
    {"pooling": "last_token"},  # EOS appended after the cut
    {"pooling": "mean", "append_eos": True},
]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module", params=POOLINGS, ids=[p["pooling"] for p in POOLINGS])
def exported(request, tmp_path_factory):
    from conftest import build_tiny

    encoder = build_tiny(max_length=MAX_LENGTH, **request.param)
    folder = tmp_path_factory.mktemp("run") / "export"
    save_export(encoder, folder, model_card(encoder.config, run="tiny", path=str(folder)))
    return encoder, folder


def test_sentence_transformers_encode_equals_the_encoder(exported):
    encoder, folder = exported
    model = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    assert model.get_embedding_dimension() == encoder.embedding_dim
    for name, kwargs in PROMPTS:
        ours = encoder.encode(TEXTS, **kwargs)
        theirs = model.encode(TEXTS, prompt_name=name, batch_size=4)
        assert theirs.shape == ours.shape
        assert cosines(theirs, ours).min() >= 0.99999, name
        np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1.0, atol=1e-5)


def test_the_prompts_are_mtebs_registration_of_c2llm(make_encoder):
    from mteb.models.model_implementations.codefuse_models import c2llm_prompts_dict

    named = sentence_prompts(make_encoder(pma_heads=4))
    assert named["query"] == "" and named["document"] == "Retrieved Answer:"
    for task, prompt in c2llm_prompts_dict.items():
        assert named[f"{task}-query"] == prompt["query"] and named[f"{task}-document"] == prompt["document"]


def test_the_folder_ships_no_code_and_sentence_transformers_asks_for_the_flag(exported):
    _, folder = exported
    assert not list(folder.rglob("*.py"))
    types = [m["type"] for m in json.loads((folder / "modules.json").read_text())]
    assert types[:2] == ["c2llm_lib.model.st_modules.Backbone", "c2llm_lib.model.st_modules.Pooler"]
    with pytest.raises(ValueError, match="trust_remote_code"):  # sentence-transformers >= 6, for any outside class
        SentenceTransformer(str(folder))


def test_the_cards_transformers_loader_equals_the_encoder(exported, capsys):
    encoder, folder = exported
    card = (folder / "README.md").read_text()
    namespace = {}
    exec(loader_from_card(card), namespace)  # the code a reader copies, as it stands in the card
    assert "AutoModel.from_pretrained" in loader_from_card(card)
    for name, kwargs in PROMPTS:
        ours = encoder.encode(TEXTS, **kwargs)
        theirs = namespace["embed"](TEXTS, name).numpy()
        assert cosines(theirs, ours).min() >= 0.99999, name


def test_the_root_loads_as_a_float32_transformers_model(exported):
    from transformers import AutoModel

    encoder, folder = exported
    model = AutoModel.from_pretrained(folder)
    assert next(model.parameters()).dtype == next(encoder.base_model.parameters()).dtype
    for key, value in encoder.base_model.state_dict().items():
        assert np.array_equal(model.state_dict()[key].numpy(), value.numpy()), key  # the merged weights, exactly


def test_a_model_with_a_lora_adapter_is_not_exported(make_encoder, tmp_path):
    with pytest.raises(ValueError, match="LoRA adapter"):
        save_export(make_encoder(pma_heads=4, use_lora=True, lora_r=4), tmp_path / "export", "card")


def test_mteb_scores_the_export_like_our_wrapper(exported, tmp_path):
    from mteb.mocks.mock_tasks.retrieval import MockRetrievalTask
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper

    from c2llm_lib.mteb_code import MTEBEncoder, run_mteb

    encoder, folder = exported
    model = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    wrapped = SentenceTransformerEncoderWrapper(model)
    wrapped.mteb_model_meta = MTEBEncoder(encoder).mteb_model_meta.model_copy(update={"name": "local/export"})
    theirs = run_mteb(wrapped, [MockRetrievalTask()], tmp_path)
    ours = run_mteb(MTEBEncoder(encoder, max_length=MAX_LENGTH), [MockRetrievalTask()], tmp_path)
    assert theirs["MockRetrievalTask"] == pytest.approx(ours["MockRetrievalTask"], abs=1e-6)


def test_the_card_states_base_model_data_decontamination_scores_and_licence(make_encoder):
    config = make_encoder(pma_heads=4).config
    data = {
        "rows": 512,
        "fingerprint": "abc123",
        "sources": {"CosQA": {"kept": 500}},
        "decontaminated": {"CosQA": {"query is a test query": 7}},
    }
    train = {"steps": 20, "train_config": {"learning_rate": 0.0001}, "model_config": {"lora_r": 64}}
    merge = {"checkpoints": ["a", "b"], "weights": [0.5, 0.5], "note": ""}
    card = model_card(config, run="r1", data=data, train=train, merge=merge)
    assert card.startswith("---\nlicense: apache-2.0\n")
    for fact in ("tiny random", "| CosQA | query is a test query | 7 |", "abc123", "| lora_r | `64` |",
                 "| learning_rate | `0.0001` |", "[0.5, 0.5]", "Not evaluated yet"):  # fmt: skip
        assert fact in card, fact
    scored = model_card(config, run="r1", results="### Held-out nDCG@10\n\n| model | mean |\n")
    assert "Not evaluated yet" not in scored and "| model | mean |" in scored
    released = model_card(config.__class__(backbone="Qwen/Qwen2.5-Coder-0.5B", backbone_revision="abc"), run="r")
    assert "base_model: Qwen/Qwen2.5-Coder-0.5B\n" in released and "| revision | `abc` |" in released


def test_merged_backbone_loads_through_automodel_in_its_stored_dtype(make_encoder, tmp_path):
    """merged/backbone holds float32 weights (merge.py upcasts a bf16 backbone); its config.json must say so, or
    `AutoModel.from_pretrained` rounds the merged update away again by loading it in bf16."""
    import torch
    from transformers import AutoModel

    encoder = make_encoder(pma_heads=4, dtype="bfloat16")
    encoder.base_model.float()  # as merge_checkpoints leaves it
    encoder.save_pretrained(tmp_path / "merged")
    model = AutoModel.from_pretrained(tmp_path / "merged" / "backbone")
    assert next(model.parameters()).dtype == torch.float32
