"""The mteb path: mteb's own mock retrieval task through our wrapper, caching, offline tasks, the prompts."""

import numpy as np
import pytest
import torch

from c2llm_lib.eval.benchmarks import MTEB_CODE_TASKS, REFERENCE_SCORES, comparison_table
from c2llm_lib.eval.mteb import MTEBEncoder, offline_task, run_mteb
from c2llm_lib.eval.tasks import offline_tasks
from c2llm_lib.files import file_digest
from c2llm_lib.prompts import C2LLM_PROMPTS

from test_eval_scoring import evaluate_encoder


def test_prompts_are_mtebs_registration_of_c2llm():
    from mteb.models.model_implementations.codefuse_models import c2llm_prompts_dict

    assert set(C2LLM_PROMPTS) == set(MTEB_CODE_TASKS) == set(c2llm_prompts_dict)
    for task, prompt in c2llm_prompts_dict.items():
        assert prompt["query"] == C2LLM_PROMPTS[task] + "\n" and prompt["document"] == "Retrieved Answer:"


def test_the_mock_task_runs_through_our_wrapper_and_is_cached(make_encoder, tmp_path):
    from mteb.mocks.mock_tasks.retrieval import MockRetrievalTask

    model = MTEBEncoder(make_encoder(pooling="mean"), batch_size=4, max_length=64)
    assert model.mteb_model_meta.embed_dim == 64 and model.mteb_model_meta.name == "local/c2llm-reproduction"
    scores = run_mteb(model, [MockRetrievalTask()], tmp_path)
    assert set(scores) == {"MockRetrievalTask"} and 0.0 <= scores["MockRetrievalTask"] <= 1.0
    assert list(tmp_path.rglob("MockRetrievalTask.json"))  # mteb's own cache layout

    def refuse(*args, **kwargs):
        raise AssertionError("a cached task was encoded again")

    model.model.encode = refuse
    assert run_mteb(model, [MockRetrievalTask()], tmp_path) == scores  # read back, not rerun


def test_mteb_scores_an_offline_task_like_our_scorer(make_encoder, tmp_path):
    encoder = make_encoder(pooling="mean")
    task = offline_tasks(limit=15, include_humaneval=False)[0]
    model = MTEBEncoder(encoder, prompts={task.name: task.instruction}, batch_size=8, max_length=128)
    via_mteb = run_mteb(model, [offline_task(task)], tmp_path)[task.name]
    ours = evaluate_encoder(lambda texts, **kw: encoder.encode(texts, **kw, max_length=128), task)["ndcg_at_10"]
    assert via_mteb == pytest.approx(ours, abs=1e-4)


def test_comparison_table_means():
    ours = {t: 0.5 for t in MTEB_CODE_TASKS}
    table = comparison_table(ours)
    assert table.loc["this run", "mean"] == 50.0
    paper = np.array(REFERENCE_SCORES["C2LLM-0.5B (paper)"])
    assert table.loc["C2LLM-0.5B (paper)", "mean"] == pytest.approx(round(paper.mean(), 2), abs=0.01)  # 75.46
    clean = np.delete(paper, MTEB_CODE_TASKS.index("CodeEditSearchRetrieval")).mean()
    assert table.loc["C2LLM-0.5B (paper)", "mean without CodeEditSearch"] == pytest.approx(round(clean, 2), abs=0.01)
    assert paper.mean() == pytest.approx(75.46, abs=0.006)  # the paper's averages, from rounded task scores
    assert np.mean(REFERENCE_SCORES["C2LLM-7B (paper)"]) == pytest.approx(80.75, abs=0.006)


def test_a_changed_max_length_or_prompt_is_a_new_computation(make_encoder, tmp_path):
    from mteb.mocks.mock_tasks.retrieval import MockRetrievalTask

    encoder = make_encoder(pooling="mean")
    calls = []

    def counting(texts, **kwargs):
        calls.append(kwargs["max_length"])
        return type(encoder).encode(encoder, texts, **kwargs)

    encoder.encode = counting
    run_mteb(MTEBEncoder(encoder, batch_size=4, max_length=64), [MockRetrievalTask()], tmp_path)
    assert calls and set(calls) == {64}
    calls.clear()
    run_mteb(MTEBEncoder(encoder, batch_size=4, max_length=64), [MockRetrievalTask()], tmp_path)
    assert not calls  # the same settings: read back from the cache
    run_mteb(MTEBEncoder(encoder, batch_size=4, max_length=16), [MockRetrievalTask()], tmp_path)
    assert calls and set(calls) == {16}  # a new max length is encoded again, not served the old scores
    calls.clear()
    override = {"MockRetrievalTask": "Find the answer"}
    run_mteb(MTEBEncoder(encoder, prompts=override, batch_size=4, max_length=16), [MockRetrievalTask()], tmp_path)
    assert calls  # a new query instruction too


def test_the_fingerprint_sees_every_setting_that_changes_a_score(make_encoder):
    from c2llm_lib.eval.mteb import fingerprint

    encoder = make_encoder(pma_heads=4)
    reference = fingerprint(encoder, 64)
    assert fingerprint(make_encoder(pma_heads=4), 64) == reference  # same model, same settings
    assert fingerprint(encoder, 128) != reference
    assert fingerprint(encoder, 64, {"HumanEval": "Find it"}) != reference
    assert fingerprint(make_encoder(pma_heads=4, prompt_style="jina"), 64) != reference
    assert fingerprint(make_encoder(pma_heads=4, document_prefix="Code: "), 64) != reference
    assert fingerprint(make_encoder(pma_heads=4, embedding_dim=32), 64) != reference
    half = make_encoder(pma_heads=4, dtype="bfloat16")
    upcast = make_encoder(pma_heads=4, dtype="bfloat16")
    upcast.base_model.float()  # the same weight values, computed in float32
    assert fingerprint(half, 64) != fingerprint(upcast, 64)


def test_dtype_auto_is_keyed_by_the_dtype_it_resolved_to(make_encoder):
    from c2llm_lib.eval.mteb import fingerprint

    float32, bfloat16 = make_encoder(pma_heads=4, dtype="auto"), make_encoder(pma_heads=4, dtype="auto")
    float32.base_model.float()  # what `auto` gives on a CPU without fast bf16
    bfloat16.base_model.to(torch.bfloat16)  # and on one with it (AMX, avx512_bf16) or a GPU
    assert float32.config.dtype == bfloat16.config.dtype == "auto"
    assert fingerprint(float32, 64) != fingerprint(bfloat16, 64)


def test_the_revision_follows_the_evaluation_batch_size(make_encoder):
    """Padding moves a bf16 embedding: results of one batch size must not answer for another."""
    encoder = make_encoder(pma_heads=4)
    revision = {b: MTEBEncoder(encoder, batch_size=b, max_length=64).mteb_model_meta.revision for b in (4, 8, 8)}
    assert len(revision) == 2 and revision[4] != revision[8]


def test_the_revision_reads_every_file_of_the_models_folder(make_encoder, tmp_path, monkeypatch):
    """The weight digest read the head, LoRA and one layer's q_proj: a merged folder whose other weights changed kept
    its revision, and mteb served the old scores."""
    import shutil

    from safetensors.torch import load_file, save_file

    from c2llm_lib import C2LLMEncoder
    from c2llm_lib.eval import mteb as mteb_code

    saved = make_encoder(pma_heads=4).save_pretrained(tmp_path / "a")
    shutil.copytree(saved, tmp_path / "b")
    weights = tmp_path / "b" / "backbone" / "model.safetensors"
    state = load_file(weights)
    state["layers.1.mlp.down_proj.weight"] += 0.01
    save_file(state, weights, metadata={"format": "pt"})
    reads = []
    monkeypatch.setattr(mteb_code, "file_digest", lambda folder: reads.append(folder) or file_digest(folder))
    a, again, b = (C2LLMEncoder.from_pretrained(tmp_path / name) for name in ("a", "a", "b"))
    revision = [MTEBEncoder(m, max_length=64).mteb_model_meta.revision for m in (a, again, b)]
    assert revision[0] == revision[1] != revision[2]
    assert MTEBEncoder(a, max_length=64).mteb_model_meta.revision == revision[0] and len(reads) == 3  # once each
    assert mteb_code.weights_digest(make_encoder(pma_heads=4)) is None  # built in memory: its tensors and config


def test_the_folder_digest_reads_names_sizes_and_bytes(tmp_path):
    import shutil

    one, two = tmp_path / "one", tmp_path / "two"
    for folder, texts in ((one, {"a": "xc\x00y"}), (two, {"a": "x", "c": "y"})):  # a byte moved across a boundary
        folder.mkdir()
        for name, text in texts.items():
            (folder / name).write_text(text)
    assert file_digest(one) != file_digest(two)
    (two / "c").write_text("z")  # a byte changed
    assert file_digest(two) != file_digest(tmp_path / "one")
    shutil.copytree(two, tmp_path / "three")
    assert file_digest(tmp_path / "three") == file_digest(two)  # names, sizes and bytes only


def test_benchmark_task_sizes_come_from_mtebs_statistics():
    from c2llm_lib.data.sources import mteb_tasks
    from c2llm_lib.eval.benchmarks import mteb_task_sizes

    sizes = mteb_task_sizes(mteb_tasks(["CosQA", "CodeEditSearchRetrieval"]))
    assert sizes["CosQA"] == {"queries": 500, "documents": 20604}
    assert sizes["CodeEditSearchRetrieval"] == {"queries": 13000, "documents": 13000}  # derived: older statistics


def test_a_set_the_untrained_poolers_do_not_score_says_so_and_compares_with_bm25_alone(make_encoder, tmp_path):
    from types import SimpleNamespace

    from c2llm_lib.eval import evaluate_set
    from c2llm_lib.eval.scoring import evaluated_models, scores_untrained

    task = offline_tasks(limit=6, include_humaneval=False)[0]
    models = {"trained": make_encoder(pooling="mean"), "untrained, mean pooling": make_encoder(seed=1, pooling="mean")}
    both = evaluate_set(models, [task], tmp_path, "trained", "Held-out", batch_size=8, max_length=64)
    alone = evaluate_set(models, [task], tmp_path, "trained", "Held-out", batch_size=8, max_length=64, untrained=False)
    assert set(both.scores) == {"trained", "untrained, mean pooling", "BM25"}
    assert set(alone.scores) == {"trained", "BM25"}
    assert alone.scores["trained"] == both.scores["trained"] and [d["b"] for d in alone.intervals] == ["BM25"]
    assert "Not scored on these tasks (`untrained_sets`): untrained, mean pooling." in alone.markdown
    assert "Not scored" not in both.markdown
    # the untrained poolers are loaded only where a set they score has tasks (here: no unseen_packages, no beir_sets)
    merged = models["trained"].save_pretrained(tmp_path / "merged")
    run_dir = SimpleNamespace(require=lambda name: merged)
    for sets, loaded in ((["unseen", "beir"], set()), (["heldout"], {"untrained, mean pooling"}), ([], set())):
        evaluation = SimpleNamespace(eval_released=None, baselines=["bm25", "mean"], untrained_sets=sets,
                                     unseen_packages=[], beir_sets=[])  # fmt: skip
        label, found = evaluated_models(evaluation, run_dir)
        assert set(found) == {label, *loaded}, sets
        assert scores_untrained(evaluation) == bool(loaded)  # the rule the preflight's projection reads too
    assert not scores_untrained(SimpleNamespace(baselines=["bm25"], untrained_sets=["heldout"], unseen_packages=[],
                                                beir_sets=[]))  # fmt: skip
