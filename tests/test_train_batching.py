"""The trainer spends no compute on padding that sorting avoids: queries and documents are embedded apart in
length-sorted micro-batches within a token budget (GradCache's chunks too), and the loss and the LoRA / PMA
gradients stay those of one padded forward of every text; each step logs its padding efficiency."""

import pytest
import torch
from datasets import Dataset

from c2llm_lib.train import TrainConfig, Trainer, micro_batches, throughput

from conftest import TINY_LORA, randomize_lora
from training_rows import SNIPPETS


def uneven_rows():
    """One (dataset, language) group whose queries and documents differ a lot in length."""
    records = []
    for i in range(8):
        code = "\n".join(SNIPPETS[i : i + 1 + (i * 5) % 7])  # 1 to 7 functions
        records.append({
            "dataset": "Set0", "language": "python", "query": "find " + "the code " * (1 + (i * 3) % 8),
            "positive": code, "negatives": [SNIPPETS[(i + 3) % 12], "\n".join(SNIPPETS[: 1 + (i * 2) % 9])],
            "instruction": "Find the code:",
        })  # fmt: skip
    return Dataset.from_list(records)


CFG = dict(global_batch_size=8, num_negatives=2, max_length=64, seed=0, grad_cache_chunk=2,  # 128 slots
           max_steps=None, warmup_steps=0, checkpoint_steps=[])  # fmt: skip


def train_config(**values) -> TrainConfig:
    """`CFG` with `values` over it."""
    return TrainConfig(**{**CFG, **values})


def record_forwards(encoder):
    """Every forward's real lengths, width and whether it built a graph."""
    seen = []

    def hook(module, args, kwargs):
        mask = kwargs["attention_mask"]  # (m, t)
        seen.append({"lengths": mask.sum(-1).tolist(), "width": mask.shape[-1], "graph": torch.is_grad_enabled()})

    return seen, encoder.register_forward_pre_hook(hook, with_kwargs=True)


def test_micro_batches_sort_by_length_within_the_budget():
    assert micro_batches([5, 192, 30, 180, 60, 100, 101, 20], budget=400) == [[1, 3], [6, 5, 4], [2, 7, 0]]
    assert micro_batches([10, 10, 10, 10], budget=25) == [[0, 1], [2, 3]]  # 2 rows x 10 <= 25 < 3 x 10
    assert micro_batches([50, 3], budget=40) == [[0], [1]]  # longer than the budget: alone
    assert micro_batches([7, 7, 7], budget=100, forward_cost=0) == [[0, 1, 2]]  # no padding to save: one forward
    assert micro_batches([100, 1], budget=1000, forward_cost=0) == [[0], [1]]  # padding 99 slots > a forward
    assert micro_batches([100, 1], budget=1000, forward_cost=200) == [[0, 1]]
    assert micro_batches([], budget=10) == []
    with pytest.raises(ValueError, match="token budget"):
        micro_batches([1], budget=0)


def reference_step(trainer, batch):
    """Loss and gradients of the former step: ONE left-padded forward of queries, positives and negatives."""
    texts, mask = trainer.train_step.texts(batch)
    tokens = trainer.encoder.tokenize_formatted(texts, trainer.cfg.max_length)  # (N, T)
    out = trainer.train_step.loss_from(trainer.encoder(**tokens), len(batch["query"]), mask, batch["dataset"][0])
    out["loss"].backward()
    return out["loss"].item(), int(tokens["attention_mask"].sum()), tokens["attention_mask"].numel()


@pytest.mark.parametrize("grad_cache", [False, True])
def test_micro_batched_step_equals_one_padded_forward(make_encoder, grad_cache):
    rows = uneven_rows()
    cfg = train_config(grad_cache=grad_cache)
    results = []
    for micro in (False, True):
        enc = make_encoder(seed=0, **TINY_LORA)
        randomize_lora(enc)  # B = 0 at init would leave LoRA's A without gradient
        trainer = Trainer(enc, rows, cfg)
        batch = rows[next(iter(trainer.sampler))]
        if micro:
            seen, handle = record_forwards(enc)
            loss = trainer.train_step.forward_backward(batch)["loss"].item()
            handle.remove()
        else:
            loss, real, padded = reference_step(trainer, batch)
        grads = {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}
        results.append((loss, grads))
    (loss_ref, grads_ref), (loss_new, grads_new) = results
    assert loss_new == pytest.approx(loss_ref, rel=1e-5)
    assert grads_ref.keys() == grads_new.keys() and any("lora_A" in n for n in grads_ref)
    assert any(n.startswith("pooler.") for n in grads_ref)
    for name, ref in grads_ref.items():  # to 1e-5 of each tensor's scale (fc_k.bias: exactly 0, up to rounding)
        scale = max(ref.abs().max().item(), 1e-3)
        torch.testing.assert_close(grads_new[name], ref, rtol=1e-5, atol=1e-5 * scale, msg=name)

    graph = [f for f in seen if f["graph"]]
    b = len(batch["query"])
    assert len(graph) > 2  # the 8 queries and 24 documents do not fit one 128-slot micro-batch each
    for f in graph:
        assert f["width"] == max(f["lengths"])  # no column of pure padding
        assert len(f["lengths"]) * f["width"] <= cfg.grad_cache_chunk * cfg.max_length or len(f["lengths"]) == 1
        assert f["lengths"] == sorted(f["lengths"], reverse=True)  # length-sorted
    embedded = sorted(n for f in graph for n in f["lengths"])
    assert len(embedded) == (2 + cfg.num_negatives) * b and sum(embedded) == real  # each text once, with a graph
    texts = trainer.train_step.texts(batch)[0]
    query_lengths = sorted(trainer.encoder.tokenize_formatted(texts[:b], cfg.max_length)["attention_mask"].sum(-1))
    taken = []
    for f in graph:  # the first micro-batches hold exactly the queries: no forward mixes them with documents
        if len(taken) < b:
            taken += f["lengths"]
    assert sorted(taken) == query_lengths
    slots = sum(len(f["lengths"]) * f["width"] for f in graph)
    assert slots < padded  # less padding than the single forward's
    if grad_cache:  # the graph-free first pass embeds the same micro-batches
        assert [f["lengths"] for f in seen if not f["graph"]] == [f["lengths"] for f in graph]


def test_each_step_logs_its_padding_efficiency(make_encoder):
    rows = uneven_rows()
    enc = make_encoder(seed=0, **TINY_LORA)
    seen, handle = record_forwards(enc)
    result = Trainer(enc, rows, train_config(max_steps=2)).train()
    handle.remove()
    real = sum(n for f in seen for n in f["lengths"])
    slots = sum(len(f["lengths"]) * f["width"] for f in seen)
    assert sum(m["tokens"] for m in result.metrics) == real
    assert all(0.5 < m["padding_efficiency"] <= 1 for m in result.metrics)
    assert throughput(result.metrics)["padding_efficiency"] == pytest.approx(real / slots)
