"""The export folder: sentence-transformers and plain transformers give `C2LLMEncoder.encode`'s embeddings, with the
prompts of mteb's registration; the model card's loader is run from the card itself."""

import json

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

from c2llm_lib.export import (
    ScoredModel,
    load_export,
    model_card,
    save_export,
    sentence_prompts,
    write_card,
)
from c2llm_lib.files import CorruptFile
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


def loader_from_card(card: str) -> str:
    """The Python of the card's "transformers alone" section (run here, so it cannot rot)."""
    section = card.split("## Use with transformers alone", 1)[-1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module", params=POOLINGS, ids=[p["pooling"] for p in POOLINGS])
def exported(request, tmp_path_factory):
    from conftest import build_tiny

    encoder = build_tiny(max_length=MAX_LENGTH, **request.param)
    folder = tmp_path_factory.mktemp("run") / "export"
    save_export(encoder, folder, card(encoder, path=str(folder)))
    return encoder, folder


def card(encoder, max_seq_length: int = MAX_LENGTH, **kwargs) -> str:
    return model_card(encoder.config, run="tiny", embedding_dim=encoder.embedding_dim, max_seq_length=max_seq_length,
                      dtype="float32", **kwargs)  # fmt: skip


def test_sentence_transformers_encode_equals_the_encoder(exported):
    encoder, folder = exported
    model = load_export(folder, device="cpu")
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

    from c2llm_lib.eval.mteb import MTEBEncoder, run_mteb

    encoder, folder = exported
    model = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    wrapped = SentenceTransformerEncoderWrapper(model)
    wrapped.mteb_model_meta = MTEBEncoder(encoder).mteb_model_meta.model_copy(update={"name": "local/export"})
    theirs = run_mteb(wrapped, [MockRetrievalTask()], tmp_path)
    ours = run_mteb(MTEBEncoder(encoder, max_length=MAX_LENGTH), [MockRetrievalTask()], tmp_path)
    assert theirs["MockRetrievalTask"] == pytest.approx(ours["MockRetrievalTask"], abs=1e-6)


def test_the_card_states_base_model_data_decontamination_scores_and_licence(make_encoder):
    encoder = make_encoder(pma_heads=4)
    config = encoder.config
    data = {
        "rows": 512,
        "fingerprint": "abc123",
        "sources": {"CosQA": {"kept": 500}},
        "decontaminated": {"CosQA": {"query is a test query": 7}},
    }
    train = {"steps": 20, "train_config": {"learning_rate": 0.0001}, "model_config": {"lora_r": 64}}
    merge = {"checkpoints": ["a", "b"], "weights": [0.5, 0.5], "note": ""}
    text = card(encoder, data=data, train=train, merge=merge)
    assert text.startswith("---\nlicense: apache-2.0\n")
    for fact in ("tiny random", "| CosQA | query is a test query | 7 |", "abc123", "| lora_r | `64` |",
                 "| learning_rate | `0.0001` |", "[0.5, 0.5]", "Not evaluated yet"):  # fmt: skip
        assert fact in text, fact
    scored = card(encoder, results="### Held-out nDCG@10\n\n| model | mean |\n",
                  scored=ScoredModel("dense", "float32", MAX_LENGTH))  # fmt: skip
    assert "Not evaluated yet" not in scored and "| model | mean |" in scored
    released = model_card(config.__class__(backbone="Qwen/Qwen2.5-Coder-0.5B", backbone_revision="abc"), run="r",
                          embedding_dim=896, max_seq_length=2048, dtype="float32")  # fmt: skip
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


# the export's length and what its card says was scored ------------------------------------------------------------
LONG = ["x = 1\n" * 40]  # 160 tokens: cut at any length below


def test_the_export_encodes_at_the_evaluated_length_not_the_training_length(make_encoder, tmp_path):
    encoder = make_encoder(pma_heads=4, max_length=MAX_LENGTH)  # trained at 24 tokens, evaluated at 64
    save_export(encoder, tmp_path / "export", card(encoder, 64), max_seq_length=64)
    assert json.loads((tmp_path / "export" / "c2llm_backbone.json").read_text())["max_seq_length"] == 64
    model = load_export(tmp_path / "export", device="cpu")
    evaluated = encoder.encode(LONG, kind="document", max_length=64)
    assert cosines(model.encode(LONG, prompt_name="document"), evaluated).min() >= 0.99999
    assert cosines(encoder.encode(LONG, kind="document"), evaluated).min() < 0.9999  # the length matters here


def test_the_card_states_the_scored_length_and_the_export_is_set_to_it(make_encoder, tmp_path):
    encoder = make_encoder(pma_heads=4, max_length=MAX_LENGTH)
    save_export(encoder, tmp_path / "export", card(encoder))
    scored = ScoredModel("dense", "float32", 48)
    with pytest.raises(ValueError, match="scores were taken at max length 48, the export encodes at 24"):
        card(encoder, results="| model | mean |", scored=scored)
    with pytest.raises(ValueError, match="results need `scored`"):
        card(encoder, 48, results="| model | mean |")
    write_card(tmp_path / "export", card(encoder, 48, results="| model | mean |", scored=scored), max_seq_length=48)
    assert json.loads((tmp_path / "export" / "c2llm_backbone.json").read_text())["max_seq_length"] == 48
    text = (tmp_path / "export" / "README.md").read_text()
    assert "| max length (tokens this folder encodes) | `48` |" in text and "| training max length | `24` |" in text
    assert "These are the scores of this folder's model" in text and "at max length 48 tokens" in text
    model = load_export(tmp_path / "export", device="cpu")
    evaluated = encoder.encode(LONG, kind="document", max_length=48)
    assert cosines(model.encode(LONG, prompt_name="document"), evaluated).min() >= 0.99999


def test_the_card_says_when_the_scored_model_is_not_the_exported_one(make_encoder):
    """After bf16 training notebook 04 scores the bf16 base plus the merged adapter; the export is the float32 dense
    merge of the same update."""
    encoder = make_encoder(pma_heads=4)
    scored = ScoredModel("adapter", "bfloat16", 512, adapter_rank=256, min_cosine=0.99912)
    text = card(encoder, 512, results="| model | mean |", scored=scored)
    for fact in ("Notebook 04 scored `merged/`: the merged update as one LoRA adapter (rank 256) over the bfloat16 "
                 "base weights, at max length 512 tokens", "dense float32 weights and encodes at the same length (512 "
                 "tokens); it was not scored itself", "cosine similarity at least 0.9991"):  # fmt: skip
        assert fact in text, fact
    assert "These are the scores of this folder's model" not in text
    close = ScoredModel("adapter", "bfloat16", 512, adapter_rank=256, min_cosine=0.9999909)
    assert "at least 0.999991." in card(encoder, 512, results="| model | mean |", scored=close)  # never "1.0000"


def test_the_card_gives_the_embedding_dimension_as_a_number(make_encoder):
    assert "| embedding dimension | `64` |" in card(make_encoder(pma_heads=4))
    assert "hidden size" not in card(make_encoder(pma_heads=4))


# loading: what the folder holds, and nothing from it runs -----------------------------------------------------------
@pytest.fixture(scope="module")
def pma_export(tmp_path_factory):
    from conftest import build_tiny

    encoder = build_tiny(max_length=MAX_LENGTH, pma_heads=4)
    folder = tmp_path_factory.mktemp("pma") / "export"
    save_export(encoder, folder, card(encoder))
    return folder


@pytest.fixture
def copy_of(pma_export, tmp_path):
    import shutil

    return shutil.copytree(pma_export, tmp_path / "export")


def test_a_class_modules_json_names_from_elsewhere_is_refused_before_anything_runs(copy_of, tmp_path):
    """With trust_remote_code=True sentence-transformers imports a module file of the folder that modules.json names;
    load_export refuses the folder first."""
    marker = tmp_path / "ran"
    (copy_of / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Evil:\n    pass\n")
    modules = json.loads((copy_of / "modules.json").read_text())
    modules[1]["type"] = "evil.Evil"
    (copy_of / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(
        CorruptFile, match=r"modules.json: entry 1 names the class 'evil.Evil'.*would import and run it"
    ):
        load_export(copy_of)
    assert not marker.exists()


def test_an_export_without_modules_json_is_refused(copy_of):
    """sentence-transformers would load it as its default model: mean pooling over the backbone."""
    (copy_of / "modules.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"modules.json is missing: .*mean pooling"):
        load_export(copy_of)


@pytest.mark.parametrize(
    ("file", "change", "problem"),
    [("1_Pooler/config.json", {"pooling": "mean", "pma_heads": 8}, r"1_Pooler/model.safetensors holds the weights of "
      r"the head .*pma.*differ in"),
     ("1_Pooler/config.json", {"pma_heads": 8}, r"differ in \['pma_heads'\]"),
     ("1_Pooler/config.json", {"pma_heads": "4"}, r"config.json: pma_heads must be a positive int, got '4'"),
     ("c2llm_backbone.json", {"torch_dtype": "load"}, r"c2llm_backbone.json: torch_dtype must be one of"),
     ("c2llm_backbone.json", {"max_seq_length": True}, r"max_seq_length must be an int of at least 2, got True")],
    ids=["mean-with-pma-weights", "heads", "heads-type", "dtype", "length"],
)  # fmt: skip
def test_crafted_settings_are_refused_by_the_loaders_themselves(copy_of, file, change, problem):
    """Checked by Backbone.load and Pooler.load, so also when sentence-transformers is called directly."""
    path = copy_of / file
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(CorruptFile, match=problem):
        SentenceTransformer(str(copy_of), trust_remote_code=True, device="cpu")
    with pytest.raises(CorruptFile, match=problem):
        load_export(copy_of)


def test_non_finite_head_weights_are_refused(copy_of):
    from safetensors.torch import load_file, save_file

    from c2llm_lib.files import tensor_metadata
    from c2llm_lib.model.poolers import HEAD_METADATA

    path = copy_of / "1_Pooler" / "model.safetensors"
    metadata, tensors = tensor_metadata(path), load_file(path)
    tensors["seed"] = torch.full_like(tensors["seed"], float("nan"))
    save_file(tensors, path, metadata=metadata)
    assert HEAD_METADATA in metadata
    with pytest.raises(CorruptFile, match=r"1_Pooler/model.safetensors: .*non-finite.*seed"):
        load_export(copy_of)


def test_an_export_without_its_tokenizer_vocabulary_is_refused(copy_of):
    (copy_of / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"export: holds no tokenizer vocabulary"):
        load_export(copy_of)


def test_notebook_04s_card_names_the_adapter_form_it_scored(make_encoder, tmp_path):
    """After bf16 training merged/ holds the bf16 base and the merged update as one adapter; the card must say so,
    with notebook 03's agreement of the two forms, and the export's own float32 weights beside it."""
    from c2llm_lib.export import evaluated_card, scored_model

    scored = make_encoder(pma_heads=4, use_lora=True, lora_r=4, dtype="bfloat16")
    assert scored_model(scored, 64, 0.999) == ScoredModel("adapter", "bfloat16", 64, 4, 0.999)
    dense = make_encoder(pma_heads=4)
    save_export(dense, tmp_path / "run" / "export", "card", max_seq_length=64)
    (tmp_path / "run" / "metrics").mkdir()
    (tmp_path / "run" / "metrics" / "merge.json").write_text(json.dumps({"forms_min_cosine": 0.99912}))
    text = evaluated_card(scored, tmp_path / "run", "| model | mean |", 64)
    facts = (
        "one LoRA adapter (rank 4) over the bfloat16 base weights, at max length 64 tokens",
        "dense float32 weights",
        "it was not scored itself",
        "at least 0.9991",
        "| weights | `float32` |",
    )
    assert all(fact in text for fact in facts), [fact for fact in facts if fact not in text]
