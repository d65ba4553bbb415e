"""Peer recipes' parts: the MRL loss against a hand-computed example, and the prompt sets."""

import math

import pytest
import torch

from c2llm_lib.losses import contrastive_loss, matryoshka_loss
from c2llm_lib.mteb_code import MTEB_CODE_V1
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
    for task in (*MTEB_CODE_V1, *OFFLINE_TASKS):
        for style in ("c2llm", "jina", "codexembed"):
            query, document = prompts(style, task)
            assert query
    assert prompts("c2llm", "CosQA")[1] == "Retrieved Answer:"
    assert prompts("jina", "CodeSearchNetCCRetrieval")[1] == "Candidate completion:\n"
    assert prompts("jina", "offline-text2code-python")[0].startswith("Find the most relevant code snippet")
    assert prompts("codexembed", "StackOverflowQA") == (
        "Instruct: Given Code or Text, retrieve relevant content. Query:",
        "",
    )
    with pytest.raises(ValueError, match="unknown prompt style"):
        prompts("e5", "CosQA")
    with pytest.raises(ValueError, match="no prompts for task"):
        prompts("jina", "NoSuchTask")
