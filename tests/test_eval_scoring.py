"""Retrieval scoring: chunked top-k, nDCG known answers, BM25 on three documents, the offline tasks."""

import math

import numpy as np
import pytest
import torch

from c2llm_lib.data.offline import load_snapshot
from c2llm_lib.eval.scoring import (
    bm25_rankings,
    chunked_topk,
    embedding_rankings,
    ndcg_at_k,
)
from c2llm_lib.eval.tables import results_frame, results_markdown
from c2llm_lib.eval.tasks import offline_tasks, task_sizes
from c2llm_lib.retrieval import RetrievalTask, corpus_text


def recall_at_k(ranked, relevant: dict[str, int], k: int = 10) -> float:
    hits = {d for d, rel in relevant.items() if rel > 0}
    return len(hits & set(ranked[:k])) / len(hits) if hits else 0.0


def score_rankings(task, rankings: dict[str, list[str]], k: int = 10) -> dict[str, float]:
    """The test's own scores of a task's rankings: mean nDCG@k and recall@k over its queries, with its sizes."""
    ids = list(task.queries)
    return {
        f"ndcg_at_{k}": float(np.mean([ndcg_at_k(rankings[q], task.qrels[q], k) for q in ids])),
        f"recall_at_{k}": float(np.mean([recall_at_k(rankings[q], task.qrels[q], k) for q in ids])),
        "queries": len(ids),
        "documents": len(task.corpus),
    }


def score_embeddings(task, queries: np.ndarray, documents: np.ndarray, k: int = 10) -> dict[str, float]:
    """Scores of a task from its normalised query (Q, d) and document (N, d) embeddings, in task order."""
    return score_rankings(task, embedding_rankings(task, queries, documents, k), k)


def evaluate_bm25(task, k: int = 10) -> dict[str, float]:
    """The BM25 baseline (bm25s, default parameters, no stopwords) on a task."""
    return score_rankings(task, bm25_rankings(task, k), k)


def evaluate_encoder(encode, task, k: int = 10, batch_size: int = 16) -> dict[str, float]:
    """Scores an encoder's `encode` (C2LLMEncoder.encode or alike) on a task by cosine top-k."""
    docs = encode([corpus_text(t) for t in task.corpus.values()], kind="document", batch_size=batch_size)
    queries = encode(list(task.queries.values()), kind="query", instruction=task.instruction, batch_size=batch_size)
    return score_embeddings(task, queries, docs, k)


def test_chunked_topk_equals_the_full_matrix():
    rng = np.random.default_rng(0)
    q, d = rng.standard_normal((7, 16)), rng.standard_normal((1000, 16))
    full = q @ d.T
    expected = np.argsort(-full, axis=1)[:, :10]
    for chunk in (1, 3, 64, 999, 5000):
        scores, idx = chunked_topk(q, d, 10, chunk=chunk)
        np.testing.assert_array_equal(idx, expected)
        np.testing.assert_allclose(scores, np.take_along_axis(full, expected, 1), rtol=1e-5)
    assert chunked_topk(q, d[:3], 10)[1].shape == (7, 3)


def test_ndcg_known_answers():
    assert ndcg_at_k(["a", "b"], {"a": 1}) == 1.0
    assert ndcg_at_k(["b", "a"], {"a": 1}) == pytest.approx(1 / math.log2(3))
    assert ndcg_at_k(["x"] * 10 + ["a"], {"a": 1}) == 0.0  # rank 11 is past the cut
    graded = ndcg_at_k(["b", "a"], {"a": 2, "b": 1})
    assert graded == pytest.approx((1 + 3 / math.log2(3)) / (3 + 1 / math.log2(3)))
    assert recall_at_k(["a", "c"], {"a": 1, "b": 1}) == 0.5


def test_bm25_on_three_documents():
    task = RetrievalTask(
        "three",
        {"q0": "sort a list of numbers", "q1": "open a file and read lines", "q2": "http request with headers"},
        {
            "d0": "def sort_numbers(numbers): return sorted(numbers) # sort a list",
            "d1": "def read_lines(path): return open(path).read().splitlines() # read lines of a file",
            "d2": "def get(url, headers): return requests.get(url, headers=headers) # http request",
        },
        {"q0": {"d0": 1}, "q1": {"d1": 1}, "q2": {"d2": 1}},
        "",
    )
    scores = evaluate_bm25(task)
    assert scores["ndcg_at_10"] == 1.0 and scores["recall_at_10"] == 1.0 and scores["queries"] == 3


def test_offline_tasks_cover_both_languages_and_humaneval():
    tasks = {t.name: t for t in offline_tasks(limit=20)}
    assert {
        "offline-text2code-python",
        "offline-text2code-javascript",
        "offline-code2code-python",
        "offline-code2code-javascript",
        "HumanEval",
    } <= set(tasks)
    for task in tasks.values():
        assert len(task.queries) == 20 and all(len(r) == 1 for r in task.qrels.values())
        assert all(d in task.corpus for r in task.qrels.values() for d in r)


def test_encoder_scores_are_deterministic_and_bounded(make_encoder):
    enc = make_encoder(pooling="mean")
    task = offline_tasks(limit=12, include_humaneval=False)[0]
    a, b = evaluate_encoder(enc.encode, task), evaluate_encoder(enc.encode, task)
    assert a == b and 0.0 <= a["ndcg_at_10"] <= 1.0 and 0.0 <= a["recall_at_10"] <= 1.0


def test_the_limit_caps_queries_never_the_corpus():
    limited = {t.name: t for t in offline_tasks(limit=5)}
    full = {t.name: t for t in offline_tasks()}
    for name, task in limited.items():
        assert len(task.queries) == 5
        assert task.corpus == full[name].corpus, name  # every held-out document of the task
        assert all(task.qrels[q] == full[name].qrels[q] for q in task.queries)
    assert len(limited["HumanEval"].corpus) == 164
    assert task_sizes(limited.values())["HumanEval"] == {"queries": 5, "documents": 164, "queries in the split": 164,
                                                         "seed": 0}  # fmt: skip


def test_the_limit_draws_offline_queries_from_every_file_not_the_first_ones():
    """The default run's eval_limit 40 took each task's first 40 rows: the alphabetically first held-out files."""
    files = {(r["query"], r["positive"]): r["file"] for r in load_snapshot() if r["split"] == "test"}
    full = {t.name: t for t in offline_tasks(include_humaneval=False)}
    for name, task in {t.name: t for t in offline_tasks(limit=40, include_humaneval=False)}.items():
        first = list(full[name].queries)[:40]
        assert set(task.queries) != set(first), name
        every = sorted({files[full[name].queries[q], full[name].corpus[d]] for q in full[name].queries
                        for d in full[name].qrels[q]})  # fmt: skip
        drawn = {files[task.queries[q], task.corpus[d]] for q in task.queries for d in task.qrels[q]}
        assert max(drawn) > every[len(every) // 2], name  # files from the second half of the split too


def test_results_markdown_says_how_many_queries_were_drawn_and_with_which_seed():
    task = offline_tasks(limit=3, include_humaneval=False)[0]
    frame = results_frame({"BM25": {task.name: evaluate_bm25(task)["ndcg_at_10"]}})
    text = results_markdown(frame, "t", task_sizes([task]))
    assert f"| *queries per task* | 3 of {task.split_queries} |  |" in text
    assert "drawn with seed 0 across all of its queries" in text
    assert "| *seed per task*" not in text and "queries in the split per task" not in text
    whole = offline_tasks(include_humaneval=False)[0]
    assert "drawn with seed" not in results_markdown(frame, "t", task_sizes([whole]))


def test_results_markdown_shows_each_corpus_size():
    task = offline_tasks(limit=3, include_humaneval=False)[0]
    frame = results_frame({"BM25": {task.name: evaluate_bm25(task)["ndcg_at_10"]}})
    text = results_markdown(frame, "t", task_sizes([task]))
    assert f"| *documents per task* | {len(task.corpus)} |  |" in text
    assert f"| *queries per task* | 3 of {task.split_queries} |  |" in text


def test_baselines_of_a_release_are_built_on_its_backbone(tmp_path):
    from safetensors.torch import load_file

    from c2llm_lib import C2LLMEncoder
    from c2llm_lib.eval.scoring import baseline_encoder, baselines

    from released_fixture import write_tiny_release

    release = write_tiny_release(tmp_path / "release")
    trained = C2LLMEncoder.from_released(release, device="cpu", dtype="float32")
    built = baselines(trained, ["mean", "last_token"])
    assert list(built) == ["released backbone, mean pooling", "released backbone, last_token pooling"]
    released = load_file(release / "model.safetensors")
    for label, baseline in built.items():
        assert baseline.config.pooling in label and not baseline.pooler.state_dict()
        for name, value in baseline.base_model.state_dict().items():
            assert torch.equal(value, released[f"plm_model.model.{name}"]), (label, name)
    assert baseline_encoder(trained, "mean").encode(["x = 1"]).shape == (1, 64)
    assert all(b.directory == release for b in built.values())  # mteb's revision hashes the release's files


def test_baselines_of_a_run_are_its_untrained_backbone(make_encoder):
    from c2llm_lib.eval.scoring import baselines

    trained = make_encoder(pma_heads=4, use_lora=True, lora_r=4)
    ((label, baseline),) = baselines(trained, ["mean"]).items()
    assert label == "untrained, mean pooling" and baseline.config.pooling == "mean"
    fresh = make_encoder(pooling="mean").base_model.state_dict()
    assert all(torch.equal(v, fresh[k]) for k, v in baseline.base_model.state_dict().items())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_baselines_of_a_saved_lora_model_read_its_base_instead_of_loading_the_backbone(
    make_encoder, tmp_path, monkeypatch, dtype
):
    import json

    import numpy as np

    from c2llm_lib import C2LLMEncoder
    from c2llm_lib.eval.scoring import baselines

    from conftest import randomize_lora

    trained = make_encoder(pma_heads=4, use_lora=True, lora_r=4, dtype=dtype)
    randomize_lora(trained)  # an adapter that changes the embeddings: the baselines must not carry it
    trained.save_pretrained(tmp_path / "merged")
    built = baselines(trained, ["mean", "last_token"])  # from the configured backbone, as before any save
    fresh = {b.config.pooling: b for b in built.values()}
    reloaded = C2LLMEncoder.from_pretrained(tmp_path / "merged")

    def no_backbone_load(cfg):
        raise AssertionError("the backbone was loaded again")

    with monkeypatch.context() as patch:
        patch.setattr(C2LLMEncoder, "from_config", no_backbone_load)
        read = baselines(reloaded, ["mean", "last_token"])
    texts = ["def add(a, b):\n    return a + b", "Sort a list of numbers in place."]
    for (label, baseline), pooling in zip(read.items(), ["mean", "last_token"], strict=True):
        assert pooling in label and not baseline.config.use_lora and baseline.base_model is baseline.backbone
        state, expected = baseline.base_model.state_dict(), fresh[pooling].base_model.state_dict()
        assert state.keys() == expected.keys() and all(torch.equal(v, expected[k]) for k, v in state.items())
        assert np.array_equal(baseline.encode(texts), fresh[pooling].encode(texts))
    assert not np.allclose(read["untrained, mean pooling"].encode(texts),
                           C2LLMEncoder(reloaded.backbone, reloaded.tokenizer, read["untrained, mean pooling"].config)
                           .encode(texts), atol=1e-4)  # fmt: skip

    assert json.loads((tmp_path / "merged" / "c2llm_config.json").read_text())["base_loaded_as"] == dtype
    # the baselines' weights now come from the folder: a base changed beyond the layer the key samples is a new key
    from safetensors.torch import load_file, save_file

    from c2llm_lib.eval.mteb import fingerprint

    before = fingerprint(read["untrained, mean pooling"], 64)
    weights_file = tmp_path / "merged" / "backbone" / "model.safetensors"
    state = load_file(weights_file)
    name = next(k for k in state if k.startswith("layers.1.") and k.endswith("mlp.up_proj.weight"))
    state[name] = state[name] + 1
    save_file(state, weights_file, metadata={"format": "pt"})
    ((_, changed),) = baselines(C2LLMEncoder.from_pretrained(tmp_path / "merged"), ["mean"]).items()
    assert fingerprint(changed, 64) != before
    # asked for another dtype than the folder stores: loaded from the backbone as before
    other = "bfloat16" if dtype == "float32" else "float32"
    cast = C2LLMEncoder.from_pretrained(tmp_path / "merged", dtype=other)
    assert C2LLMEncoder.saved_base(tmp_path / "merged", cast.config) is None
    ((_, built),) = baselines(cast, ["mean"]).items()
    assert next(built.base_model.parameters()).dtype == getattr(torch, other)
    # saved again after the cast: its base is no longer the source's conversion in the stored dtype, and is not read
    cast.save_pretrained(tmp_path / "cast")
    assert json.loads((tmp_path / "cast" / "c2llm_config.json").read_text())["base_loaded_as"] is None
    assert C2LLMEncoder.saved_base(tmp_path / "cast", cast.config) is None
    # a folder without an adapter holds trained weights, not the base
    dense = make_encoder(pma_heads=4, dtype=dtype)
    dense.save_pretrained(tmp_path / "dense")
    assert C2LLMEncoder.saved_base(tmp_path / "dense", dense.config) is None


def test_max_documents_keeps_every_evaluated_positive_and_a_fixed_sample():
    full = {t.name: t for t in offline_tasks(limit=40)}
    capped = {t.name: t for t in offline_tasks(limit=40, max_documents=500)}
    again = {t.name: t for t in offline_tasks(limit=40, max_documents=500)}
    other_seed = {t.name: t for t in offline_tasks(limit=40, max_documents=500, seed=1)}
    sizes = {name: len(t.corpus) for name, t in capped.items()}
    assert sizes == {name: min(500, len(t.corpus)) for name, t in full.items()}
    assert sizes["offline-text2code-python"] == 500 < len(full["offline-text2code-python"].corpus) == 1192
    for name, task in capped.items():
        assert all(d in task.corpus for relevant in task.qrels.values() for d in relevant), name  # every positive
        assert task.corpus.items() <= full[name].corpus.items()  # same ids and texts, a subset
        assert list(task.corpus) == [d for d in full[name].corpus if d in task.corpus]  # in the full task's order
        assert task.corpus == again[name].corpus and task.queries == full[name].queries
    assert other_seed["offline-text2code-python"].corpus != capped["offline-text2code-python"].corpus
    many = offline_tasks(limit=600, max_documents=500)[1]  # more positives than the cap: all of them kept, no other
    assert set(many.corpus) == {d for relevant in many.qrels.values() for d in relevant} and len(many.corpus) > 500
    with pytest.raises(ValueError, match="max_documents"):
        offline_tasks(max_documents=0)


def test_eval_max_documents_below_200_is_refused_by_name():
    from c2llm_lib.checks import ConfigError
    from c2llm_lib.config import EvalStage

    with pytest.raises(ConfigError, match="'eval_max_documents' must be at least 200"):
        EvalStage(eval_max_documents=199)
    assert EvalStage(eval_max_documents=200).eval_max_documents == 200
