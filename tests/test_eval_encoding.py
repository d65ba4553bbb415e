"""Evaluation cost: one backbone pass per text serves both untrained poolers, no model encodes a text twice, and
the scores and embeddings stay what each encoder gives on its own; the table states the evaluation length."""

import numpy as np
import pytest

from c2llm_lib.data.offline import humaneval_records
from c2llm_lib.data.sources import TABLE_1
from c2llm_lib.eval.encoding import EncodingCache
from c2llm_lib.eval.mteb import MTEBEncoder, evaluate_all, offline_task, run_mteb
from c2llm_lib.eval.scoring import baselines
from c2llm_lib.eval.tables import results_frame, results_markdown
from c2llm_lib.eval.tasks import task_from_rows, task_sizes
from c2llm_lib.retrieval import Truncated

INSTRUCTION = TABLE_1["CodeSearchNetRetrieval"]


def count_rows(encoder) -> list[int]:
    """Counts the sequences that go through `encoder`'s backbone (every forward, whoever calls it)."""
    seen = [0]

    def hook(module, args, kwargs, out):
        seen[0] += len(kwargs["input_ids"])  # (B, T): B sequences

    encoder.backbone.register_forward_hook(hook, with_kwargs=True)
    return seen


def token_texts(encoder, lengths: list[int], prefix: str = "Retrieved Answer:") -> list[str]:
    """Texts (stripped, as mteb passes documents) whose formatted document tokenises to exactly each of `lengths`
    tokens (" x" is one token)."""
    base = len(encoder.tokenizer(prefix + "def", add_special_tokens=False)["input_ids"])
    texts = ["def" + " x" * (n - base) for n in lengths]
    got = [len(r) for r in encoder.tokenizer([prefix + t for t in texts], add_special_tokens=False)["input_ids"]]
    assert got == lengths
    return texts


def test_one_backbone_pass_serves_mean_and_last_token_pooling(make_encoder):
    trained = make_encoder(pma_heads=4, use_lora=True, lora_r=4)
    built = baselines(trained, ["mean", "last_token"])
    mean, last = built["untrained, mean pooling"], built["untrained, last_token pooling"]
    assert mean.backbone is last.backbone  # loaded once
    cache = EncodingCache([mean, last])
    seen = count_rows(mean)
    # shorter than, one below, at, and past the 12-token limit: EOS pooling truncates one token earlier
    texts = token_texts(mean, [5, 8, 11, 12, 13, 30]) + ["def f(x): return x"]
    kwargs = {"kind": "document", "instruction": "Retrieved Answer:", "batch_size": 3, "max_length": 12}
    shared = {e.config.pooling: cache.encode(e, texts, **kwargs) for e in (mean, last)}
    passes = seen[0]
    for encoder in (mean, last):
        alone = encoder.encode(texts, **kwargs)
        np.testing.assert_allclose(shared[encoder.config.pooling], alone, atol=1e-5, rtol=0)
        assert shared[encoder.config.pooling].dtype == np.float32
    # one pass per text, two for the three texts of 12 or more tokens, which the poolers cut differently
    assert passes == cache.sequences == len(texts) + 3


def test_eos_changes_no_earlier_hidden_state(make_encoder):
    """The reason one pass serves both: attention is causal, so appending EOS leaves the states before it alone."""
    import torch

    encoder = make_encoder(pooling="mean")
    plain = encoder.tokenize(["def f(x): return x + 1"], "document")
    ids = torch.cat([plain["input_ids"], torch.tensor([[encoder.tokenizer.eos_token_id]])], dim=1)
    with torch.inference_mode():
        before = encoder.hidden_states(plain["input_ids"], plain["attention_mask"])  # (1, T, d)
        after = encoder.hidden_states(ids, torch.ones_like(ids))  # (1, T + 1, d)
    torch.testing.assert_close(after[:, :-1], before, atol=1e-5, rtol=0)


def small_tasks():
    rows = humaneval_records()[:24]
    # two tasks with the same documents (and the same query instruction): each text is computed once
    return [
        task_from_rows("HumanEval", rows, INSTRUCTION),
        task_from_rows("offline-text2code-python", rows, INSTRUCTION),
    ]


def test_evaluate_all_runs_the_baselines_backbone_once_per_text(make_encoder, tmp_path):
    trained = make_encoder(pma_heads=4, use_lora=True, lora_r=4)
    models = baselines(trained, ["mean", "last_token"])
    seen = count_rows(next(iter(models.values())))
    tasks = small_tasks()
    scores = evaluate_all(
        models, tasks, tmp_path / "shared", bm25=False, batch_size=8, max_length=2048, log=lambda *_: None
    )
    texts = {t for task in tasks for t in [*task.queries.values(), *task.corpus.values()]}
    assert seen[0] == len(texts) == 48  # 24 queries and 24 documents, for both poolers and both tasks
    for label, encoder in models.items():  # the scores mteb gives each model alone, without the cache
        alone = run_mteb(MTEBEncoder(encoder, batch_size=8, max_length=2048), [offline_task(t) for t in tasks],
                         tmp_path / "alone" / label.replace(" ", "-").replace(",", ""))  # fmt: skip
        assert scores[label] == pytest.approx(alone, abs=1e-4), label


def test_a_truncated_view_reads_its_encoders_embeddings(make_encoder, tmp_path):
    trained = make_encoder(pma_heads=4)
    views = {
        "PMA": trained,
        "PMA truncated to 32": Truncated(trained, 32),
        "PMA truncated to 16": Truncated(trained, 16),
    }
    seen = count_rows(trained)
    task = small_tasks()[0]
    evaluate_all(views, [task], tmp_path, bm25=False, batch_size=8, max_length=256, log=lambda *_: None)
    assert seen[0] == len(task.queries) + len(task.corpus)  # once, not once per view
    cache = EncodingCache([trained])
    texts = list(task.corpus.values())[:6]
    for normalize in (True, False):
        got = cache.encode(views["PMA truncated to 16"], texts, kind="document", max_length=256, normalize=normalize)
        want = views["PMA truncated to 16"].encode(texts, kind="document", max_length=256, normalize=normalize)
        assert got.shape == (6, 16)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_the_cache_refuses_bad_texts_like_encode(make_encoder):
    with pytest.raises(TypeError, match="text 1 is int"):
        EncodingCache().encode(make_encoder(pooling="mean"), ["ok", 3], kind="document", max_length=32)


def test_the_table_states_the_length_and_the_truncated_documents(make_encoder):
    encoder = make_encoder(pooling="mean")
    lengths = [5, 20, 21, 40]  # formatted document tokens; at max length 20 the last two are cut
    docs = token_texts(encoder, lengths)
    queries = ["query 0", "query 1", "query 2", "a query long enough, with its instruction, to pass twenty tokens"]
    rows = [{"query": q, "positive": d} for q, d in zip(queries, docs, strict=True)]
    task = task_from_rows("HumanEval", rows, INSTRUCTION)  # the instruction is 11 tokens, with its newline
    sizes = task_sizes([task], encoder, 20)
    assert sizes["HumanEval"] == {"queries": 4, "documents": 4, "truncated queries": 1, "truncated documents": 2}
    last = make_encoder(pooling="last_token")  # EOS takes one of the 20 tokens: the 20-token document is cut too
    assert task_sizes([task], last, 20)["HumanEval"]["truncated documents"] == 3
    frame = results_frame({"BM25": {"HumanEval": 0.5}})
    text = results_markdown(frame, "t", sizes, max_length=20)
    assert "| *truncated documents at 20 tokens per task* | 2 |  |" in text
    assert "Evaluated at max length 20 tokens" in text


def test_an_encoder_alone_on_its_backbone_gets_exactly_its_own_embeddings(make_encoder):
    from conftest import randomize_lora

    trained = make_encoder(pma_heads=4, use_lora=True, lora_r=4)
    randomize_lora(trained)
    texts = [r["positive"] for r in humaneval_records()[:20]]
    kwargs = {"kind": "document", "instruction": "Retrieved Answer:", "batch_size": 4, "max_length": 64}
    np.testing.assert_array_equal(
        EncodingCache([trained]).encode(trained, texts, **kwargs), trained.encode(texts, **kwargs)
    )


def test_a_cached_score_belongs_to_the_tasks_queries_corpus_and_qrels(make_encoder, tmp_path):
    """A changed eval_limit (or eval_max_documents) keeps each task's name but changes what it ranks: the cache must
    not answer for the new task with the old one's score (issue 23: 5 queries scored, then 44 "scored" the same)."""
    encoder = make_encoder(pma_heads=4)
    models = {"m": encoder, "m truncated to 16": Truncated(encoder, 16)}  # the ablations' views use this cache too
    rows = humaneval_records()[:40]
    few, many = task_from_rows("HumanEval", rows, INSTRUCTION, limit=3), task_from_rows("HumanEval", rows, INSTRUCTION)
    quiet = {"bm25": False, "batch_size": 8, "max_length": 64, "log": lambda *_: None}
    evaluate_all(models, [few], tmp_path / "shared", **quiet)
    again = evaluate_all(models, [many], tmp_path / "shared", **quiet)
    fresh = evaluate_all(models, [many], tmp_path / "fresh", **quiet)
    alone = evaluate_all(models, [few], tmp_path / "alone", **quiet)
    for label in models:
        assert alone[label] != pytest.approx(fresh[label], abs=1e-4)  # the tasks score differently: the check can fail
        assert again[label] == pytest.approx(fresh[label], abs=1e-6), label
    # the same limit again is read back: the cache still serves a task it holds
    assert evaluate_all(models, [many], tmp_path / "shared", **quiet) == again
    # the corpus alone changed (eval_max_documents) with the same queries: a new score too
    smaller = task_from_rows("HumanEval", rows, INSTRUCTION, limit=3, max_documents=10)
    assert smaller.queries == few.queries and len(smaller.corpus) < len(few.corpus)
    assert offline_task(smaller).metadata.revision != offline_task(few).metadata.revision
    # and the qrels alone
    moved = task_from_rows("HumanEval", rows, INSTRUCTION)
    moved.qrels["q0"] = {"d1": 1}
    assert offline_task(moved).metadata.revision != offline_task(many).metadata.revision
