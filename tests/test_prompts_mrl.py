"""Peer recipes' parts: the MRL loss against a hand-computed example, and the prompt sets."""

import math

import pytest
import torch

from c2llm_lib.eval.benchmarks import MTEB_CODE_TASKS
from c2llm_lib.losses import contrastive_loss, matryoshka_loss
from c2llm_lib.prompts import OFFLINE_TASKS, prompts


def test_mrl_known_answer():
    q = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    p = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    out = matryoshka_loss(q, p, dims=(2, 1), weights=(1.0, 0.5), tau=1.0)
    # d = 2: cosines q0.p = [1, 0], q1.p = [1/sqrt2, 1/sqrt2]
    at2 = (math.log(1 + math.exp(-1)) + math.log(2)) / 2
    # d = 1: every vector's first coordinate normalises to 1 or 0: q0.p = [1, 0], q1.p = [1, 0] (p1 has norm 0)
    at1 = (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(1))) / 2
    assert out["loss@2"].item() == pytest.approx(at2, rel=1e-6)
    assert out["loss@1"].item() == pytest.approx(at1, rel=1e-6)
    assert out["loss"].item() == pytest.approx(at2 + 0.5 * at1, rel=1e-6)


def test_mrl_at_full_width_is_the_plain_loss():
    gen = torch.Generator().manual_seed(0)
    q, p, n = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen), torch.randn(4, 2, 8, generator=gen)
    assert matryoshka_loss(q, p, n, dims=(8,))["loss"].item() == pytest.approx(contrastive_loss(q, p, n)["loss"].item())
    with pytest.raises(ValueError, match="do not fit"):
        matryoshka_loss(q, p, dims=(16,))
    with pytest.raises(ValueError, match="weights"):
        matryoshka_loss(q, p, dims=(8, 4), weights=(1.0,))


def test_prompt_sets_cover_every_task():
    for task in (*MTEB_CODE_TASKS, *OFFLINE_TASKS):
        for style in ("c2llm", "jina", "codexembed"):
            query, document = prompts(style, task)
            assert query
    assert prompts("c2llm", "CosQA")[1] == "Retrieved Answer:"
    assert prompts("jina", "CodeSearchNetCCRetrieval")[1] == "Candidate completion:\n"
    assert prompts("jina", "offline-text2code-python")[0].startswith("Find the most relevant code snippet")
    assert prompts("codexembed", "StackOverflowQA") == (
        "Instruct: Given Code or Text, retrieve relevant content. Query: ",
        "",
    )
    assert prompts("codexembed", "AnyTrainingSet") == prompts("codexembed", "CosQA")  # one instruction for all
    assert prompts("c2llm", "CosQA", document_prefix="Doc:")[1] == "Doc:"
    with pytest.raises(ValueError, match="unknown prompt style"):
        prompts("e5", "CosQA")
    with pytest.raises(ValueError, match="no c2llm prompts for task 'NoSuchTask'"):
        prompts("c2llm", "NoSuchTask")


def test_a_users_group_and_heldout_tasks_take_the_documented_fallback():
    from c2llm_lib.data.sources import TABLE_1
    from c2llm_lib.prompts import JINA_CATEGORIES, USER_CATEGORY, recipe_task

    assert USER_CATEGORY == "NL2Code"
    for name in ("own-pairs", "heldout-own-pairs-python", "my-beir-set", "NoSuchTask"):  # not in jina's table
        assert prompts("jina", name) == JINA_CATEGORIES["NL2Code"]
    # a code run's held-out tasks take the prompts of the recipe that mined them, in every style
    assert recipe_task("heldout-code2code-go") == "CodeSearchNetCCRetrieval"
    assert recipe_task("heldout-text2code-c++") == "CodeSearchNetRetrieval"
    assert recipe_task("heldout-text2code-klingon") == "heldout-text2code-klingon"  # not a language: a user's name
    assert prompts("jina", "heldout-code2code-go") == JINA_CATEGORIES["Code2Completion"]
    assert prompts("jina", "heldout-text2code-go") == JINA_CATEGORIES["NL2Code"]
    assert prompts("c2llm", "heldout-code2code-rust") == (TABLE_1["CodeSearchNetCCRetrieval"], "Retrieved Answer:")
    with pytest.raises(ValueError, match="no c2llm prompts for task 'own-pairs'.*from its rows or an override"):
        prompts("c2llm", "own-pairs")  # c2llm trains on the rows' own instructions: evaluation gives the task's


# the peer recipes wired into training and evaluation -----------------------------------------------------------
def _rows(dataset: str):
    from training_rows import make_rows

    return make_rows().map(lambda r: {"dataset": dataset})


def test_the_trainer_formats_each_prompt_style():
    from c2llm_lib.config import TrainConfig
    from c2llm_lib.train import Trainer

    from conftest import TINY_LORA, build_tiny

    batch = _rows("CodeSearchNetRetrieval")[:2]
    no_checkpoints = {"checkpoint_steps": []}  # a Trainer without a checkpoint folder writes none
    texts = {}
    for style in ("c2llm", "jina", "codexembed"):
        enc = build_tiny(**TINY_LORA, prompt_style=style)
        trainer = Trainer(enc, _rows("CodeSearchNetRetrieval"), TrainConfig(global_batch_size=4, num_negatives=1,
                                                                            **no_checkpoints))  # fmt: skip
        texts[style], mask = trainer.train_step.texts(batch)
        assert mask.tolist() == [[True], [True]] and len(texts[style]) == 6  # 2 queries, 2 positives, 2 negatives
    query, positive = batch["query"][0], batch["positive"][0]
    assert texts["c2llm"][0] == "Find the code:\n" + query and texts["c2llm"][2] == "Retrieved Answer:" + positive
    assert texts["jina"][0] == "Find the most relevant code snippet given the following query:\n" + query
    assert texts["jina"][2] == "Candidate code snippet:\n" + positive
    assert texts["codexembed"][0] == "Instruct: Given Code or Text, retrieve relevant content. Query: " + query
    assert texts["codexembed"][2] == positive  # no document prefix
    # a user's own group (data_source files): jina's text-to-code category, not an error
    jina = Trainer(build_tiny(**TINY_LORA, prompt_style="jina"), _rows("own-pairs"),
                   TrainConfig(global_batch_size=4, **no_checkpoints))  # fmt: skip
    own, _ = jina.train_step.texts(_rows("own-pairs")[:2])
    assert own[0] == "Find the most relevant code snippet given the following query:\n" + query
    assert own[2] == "Candidate code snippet:\n" + positive


def test_the_trainer_applies_mrl_and_refuses_a_width_it_cannot_cut():
    from c2llm_lib.checks import ConfigError
    from c2llm_lib.config import TrainConfig
    from c2llm_lib.train import Trainer

    from conftest import TINY_LORA, build_tiny

    rows = _rows("CodeSearchNetRetrieval")
    cfg = TrainConfig(global_batch_size=4, num_negatives=2, max_steps=2, warmup_steps=0, max_length=64,
                      mrl_dims=[32, 16], mrl_weights=[0.5, 0.25], checkpoint_steps=[])  # fmt: skip
    trainer = Trainer(build_tiny(**TINY_LORA), rows, cfg)
    metrics = trainer.train().metrics
    for m in metrics:  # the full width (64, weight 1) and each smaller width, weighted
        assert m["loss"] == pytest.approx(m["loss@64"] + 0.5 * m["loss@32"] + 0.25 * m["loss@16"], rel=1e-5)
    emb = torch.randn(4 * 4, 64, generator=torch.Generator().manual_seed(0))  # 4 queries, 4 positives, 4 x 2 negatives
    out = trainer.train_step.loss_from(emb, 4, torch.ones(4, 2, dtype=torch.bool), "CodeSearchNetRetrieval")
    q, p, n = emb[:4], emb[4:8], emb[8:].view(4, 2, 64)
    expected = matryoshka_loss(q, p, n, dims=(64, 32, 16), weights=(1.0, 0.5, 0.25))["loss"]
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-6)
    with pytest.raises(ValueError, match=r"mrl_dims \[64\] are not below the embedding width 64"):
        Trainer(build_tiny(**TINY_LORA), rows, TrainConfig(global_batch_size=4, mrl_dims=[64], checkpoint_steps=[]))
    with pytest.raises(ConfigError, match="mrl_weights"):
        TrainConfig(mrl_dims=[32, 16], mrl_weights=[1.0])
    with pytest.raises(ConfigError, match="mrl_dims.*repeats"):
        TrainConfig(mrl_dims=[32, 32])


def test_linear_decay_to_the_end_learning_rate():
    from c2llm_lib.train import lr_lambda

    f = lr_lambda(warmup=2, total=10, min_ratio=0.1, schedule="linear")  # CodeXEmbed: 5e-5 -> 5e-6
    assert [f(0), f(1), f(2)] == [0.5, 1.0, 1.0]
    assert f(6) == pytest.approx(0.55) and f(10) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="unknown learning-rate schedule"):
        lr_lambda(0, 10, 0.0, "step")


def test_the_mteb_wrapper_uses_the_encoders_prompt_style():
    from c2llm_lib.eval.mteb import MTEBEncoder
    from c2llm_lib.prompts import C2LLM_PROMPTS, JINA_CATEGORIES

    from conftest import build_tiny

    c2llm = MTEBEncoder(build_tiny(pooling="mean", document_prefix="Doc:"))
    assert c2llm.task_prompts("CosQA") == (C2LLM_PROMPTS["CosQA"], "Doc:")
    assert c2llm.task_prompts("MockRetrievalTask") == ("", "Doc:")  # unknown: no instruction, as mteb does
    jina = MTEBEncoder(build_tiny(pooling="last_token", prompt_style="jina"))
    assert jina.task_prompts("CodeFeedbackMT") == JINA_CATEGORIES["TechQA"]
    assert jina.task_prompts("offline-code2code-python") == JINA_CATEGORIES["Code2Completion"]
    assert jina.task_prompts("MockRetrievalTask") == JINA_CATEGORIES["NL2Code"]  # a task jina's table lacks
    assert MTEBEncoder(jina.model, prompts={"MockRetrievalTask": "Q:"}).task_prompts("MockRetrievalTask")[0] == "Q:"


def test_an_instruction_ending_in_a_space_gets_no_newline():
    from conftest import build_tiny

    enc = build_tiny(pooling="mean")
    assert enc.format_texts(["x"], "query", "Query: ") == ["Query: x"]
    assert enc.format_texts(["x"], "query", "Find:") == ["Find:\nx"]
    assert enc.format_texts(["x"], "query", "Find:\n") == ["Find:\nx"]
    assert enc.format_texts(["x"], "document", "Candidate:\n") == ["Candidate:\nx"]
