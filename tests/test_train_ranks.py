"""Several processes over enough steps to meet their unequal cases: each rank groups its own texts into
micro-batches, so at some steps the ranks run different numbers of forwards, and some rows hold fewer than K hard
negatives. Training must neither hang nor change: 2 and 3 processes end with one process's weights and losses on the
concatenated batches, the hard-negative term included."""

from datetime import timedelta

import pytest
import torch

from c2llm_lib.train import TrainConfig, Trainer

from conftest import TINY_LORA, build_tiny
from spawn import run_processes
from training_rows import uneven_rows

CFG = dict(global_batch_size=6, num_negatives=3, learning_rate=5e-3, warmup_steps=2, max_length=48, seed=0,
           grad_cache_chunk=2, max_steps=8, checkpoint_steps=[])  # fmt: skip


def trainable(encoder):
    return {n: p.detach().clone() for n, p in encoder.named_parameters() if p.requires_grad}


def _worker(rank, world, init_file, out, grad_cache):
    import torch.distributed as dist

    # a short timeout: ranks whose collectives stop matching fail the test instead of hanging it
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))  # fmt: skip
    try:
        encoder = build_tiny(**TINY_LORA)
        trainer = Trainer(encoder, uneven_rows(), TrainConfig(**CFG, grad_cache=grad_cache))
        metrics = trainer.train(progress=False).metrics
        out[rank] = {"metrics": metrics, "weights": trainable(encoder), "k": trainer.k}
        del trainer
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world,grad_cache", [(2, True), (3, False)])
def test_ranks_with_unequal_micro_batches_train_like_one(world, grad_cache):
    ranks = run_processes(_worker, world, grad_cache, timeout=400)
    steps = [[m["forwards"] for m in ranks[r]["metrics"]] for r in range(world)]
    assert all(len(s) == CFG["max_steps"] for s in steps)  # no rank stopped early
    assert any(len({s[i] for s in steps}) > 1 for i in range(CFG["max_steps"])), steps  # the unequal case was met
    encoder = build_tiny(**TINY_LORA)
    single = Trainer(encoder, uneven_rows(), TrainConfig(**CFG, grad_cache=grad_cache))
    reference = single.train(progress=False).metrics
    assert single.k == ranks[0]["k"] == 3  # K is the run's, not the minimum over a rank's slice
    assert any(m["short_of_k"] for m in reference)  # rows with fewer than K negatives were met...
    for key in ("loss", "in_batch", "hard_negative", "short_of_k"):  # ...and train the same loss on every layout
        expected = [m[key] for m in reference]
        for r in range(world):
            assert [m[key] for m in ranks[r]["metrics"]] == pytest.approx(expected, rel=1e-4, abs=1e-6), (key, r)
    assert all(m["hard_negative"] > 0 for m in reference)  # never switched off for a whole batch
    # fc_k's bias cannot change an output (tests/test_train.py): its gradient is rounding noise
    for name, value in trainable(encoder).items():
        if "fc_k.bias" in name:
            continue
        for r in range(world):
            torch.testing.assert_close(ranks[r]["weights"][name], value, rtol=1e-4, atol=2e-5, msg=f"{name} rank {r}")
