"""Trainer on a tiny model: GradCache equality, exact resume, NaN stop, 2 processes == 1 process (weights and logged
losses), and with 2 processes: each rank resumes its own RNG, and a NaN on one rank stops both."""

import os
import random
from datetime import timedelta

import numpy as np
import pytest
import torch

from c2llm_lib.train import NonFiniteLoss, TrainConfig, Trainer, encoder_from_checkpoint, lr_lambda

from conftest import TINY_LORA, build_tiny
from spawn import run_processes
from training_rows import SNIPPETS, make_rows, train_until_killed


def tiny(make_encoder, seed=0):
    return make_encoder(seed=seed, **TINY_LORA)


# all epochs of the rows (max_steps None) and no checkpoints unless a test asks for them
CFG = dict(global_batch_size=4, num_negatives=2, learning_rate=5e-3, warmup_steps=2, max_length=64, seed=0,
           max_steps=None, checkpoint_steps=[])  # fmt: skip


def train_config(**values) -> TrainConfig:
    """`CFG` with `values` over it."""
    return TrainConfig(**{**CFG, **values})


def trainable(encoder):
    return {n: p.detach().clone() for n, p in encoder.named_parameters() if p.requires_grad}


def test_grad_cache_equals_the_plain_step(make_encoder):
    rows = make_rows()
    grads, losses = [], []
    for grad_cache in (False, True):
        enc = tiny(make_encoder)
        trainer = Trainer(enc, rows, train_config(grad_cache=grad_cache, grad_cache_chunk=3))
        batch = rows[next(iter(trainer.sampler))]
        out = trainer.train_step.forward_backward(batch)
        losses.append(out["loss"].item())
        grads.append({n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None})
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_resume_after_a_kill_ends_with_the_same_weights(make_encoder, tmp_path, monkeypatch):
    rows = make_rows()
    cfg = train_config(max_steps=6, checkpoint_steps=[3])
    straight = tiny(make_encoder)
    result = Trainer(straight, rows, cfg, tmp_path / "a").train()
    assert result.steps == 6 and len(result.metrics) == 6

    killed = Trainer(tiny(make_encoder), rows, cfg, tmp_path / "b")
    train_until_killed(killed, 4, monkeypatch)

    resumed_encoder = tiny(make_encoder, seed=123)  # a different init: everything must come from the checkpoint
    resumed = Trainer(resumed_encoder, rows, cfg, tmp_path / "b")
    resumed.resume(tmp_path / "b" / "step-000003")
    result_b = resumed.train()
    assert result_b.steps == 6 and [m["loss"] for m in result_b.metrics] == [m["loss"] for m in result.metrics]
    for name, value in trainable(straight).items():
        assert torch.equal(value, trainable(resumed_encoder)[name]), name


def test_a_nan_loss_stops_and_keeps_the_last_checkpoint(make_encoder, tmp_path, monkeypatch):
    import c2llm_lib.train.step as train_mod

    rows = make_rows()
    real = train_mod.contrastive_loss
    calls = {"n": 0}

    def nan_on_second_step(*args, **kwargs):
        calls["n"] += 1
        out = real(*args, **kwargs)
        if calls["n"] == 2:
            out["loss"] = out["loss"] * float("nan")
        return out

    monkeypatch.setattr(train_mod, "contrastive_loss", nan_on_second_step)
    enc = tiny(make_encoder)
    trainer = Trainer(enc, rows, train_config(max_steps=4, checkpoint_steps=[1]), tmp_path)
    with pytest.raises(NonFiniteLoss, match=r"loss is nan at step 2 \(dataset Set\d\).*Last checkpoint written, with "
                       r"finite weights \(finite, not necessarily good: check its loss\): .*step-000001"):  # fmt: skip
        trainer.train()
    assert trainer.step == 1
    reloaded = encoder_from_checkpoint(tmp_path / "step-000001", device="cpu")
    torch.testing.assert_close(reloaded.pooler.state_dict(), enc.pooler.state_dict())  # no update after the NaN


def test_warmup_then_cosine_in_optimizer_steps():
    f = lr_lambda(warmup=4, total=10, min_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == pytest.approx(1.0) and f(9) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(5 / 6 * torch.pi)).item())
    )
    assert f(10) == pytest.approx(0.1)


def test_bad_training_config():
    from c2llm_lib.checks import ConfigError

    with pytest.raises(ConfigError, match="global_batch_size"):
        TrainConfig(global_batch_size=1)
    with pytest.raises(ConfigError, match="loss_weights"):
        TrainConfig(loss_weights={"CodeEditSearchRetrieval": -1.0})


def test_loss_weights_must_name_a_dataset_of_the_rows(make_encoder):
    from c2llm_lib.checks import ConfigError

    cfg = train_config(loss_weights={"Set1": 2.0, "Sett0": 0.5})  # a typo was weighed nowhere, silently
    with pytest.raises(ConfigError, match=r"'loss_weights' names no dataset of the training rows: 'Sett0' \(did you "
                       r"mean 'Set0'\?\); the rows hold \['Set0', 'Set1'\]"):  # fmt: skip
        Trainer(tiny(make_encoder), make_rows(), cfg)
    Trainer(tiny(make_encoder), make_rows(), train_config(loss_weights={"Set1": 2.0}))  # a real name trains


def test_a_max_length_with_no_room_after_the_prompt_is_refused(make_encoder):
    """max_length 2 once cut every query inside its instruction, silently. The longest prompt of the rows counts:
    CodeFeedbackMT's instruction (table 1) is 29 tokens with its newline."""
    from c2llm_lib.checks import ConfigError
    from c2llm_lib.data.sources import TABLE_1

    with pytest.raises(ConfigError, match=r"'max_length' \(2 tokens\) leaves no room for text: the run's longest "
                       r"prompt, '(Find the code:\\n|Retrieved Answer:)', takes 4; give at least 20"):  # fmt: skip
        Trainer(tiny(make_encoder), make_rows(), train_config(max_length=2))
    rows = make_rows().map(lambda r, i: {"instruction": TABLE_1["CodeFeedbackMT"] if i == 3 else r["instruction"]},
                           with_indices=True)  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"'max_length' \(44 tokens\).*'Given a multi-turn.*takes 29; give at least 45"
    ):
        Trainer(tiny(make_encoder), rows, train_config(max_length=44))
    Trainer(tiny(make_encoder), rows, train_config(max_length=45))
    codex = make_encoder(**TINY_LORA, prompt_style="codexembed", pooling="last_token")  # EOS appended: one more
    named = make_rows().map(lambda r: {"dataset": "CosQA"})
    with pytest.raises(
        ConfigError, match=r"'Instruct: Given Code or Text, retrieve relevant content. Query: ', takes 16"
    ):
        Trainer(codex, named, train_config(max_length=31))


def _train_worker(rank, world, init_file, out):
    import torch.distributed as dist

    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        enc = build_tiny(**TINY_LORA)
        trainer = Trainer(enc, make_rows(), train_config(max_steps=4))
        result = trainer.train()
        out[rank] = {
            "groups": [(m["dataset"], m["language"]) for m in result.metrics],
            "lrs": [m["lr"] for m in result.metrics],
            "losses": [m["loss"] for m in result.metrics],
            "weights": trainable(enc),
        }
        del trainer
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_processes_train_like_one(make_encoder):
    two = run_processes(_train_worker, 2)
    assert two[0]["groups"] == two[1]["groups"]  # every rank drew the same (dataset, language) at every step
    peak = CFG["learning_rate"]
    assert two[0]["lrs"][:2] == pytest.approx([peak / 2, peak])  # warmup in optimizer steps, not per process
    enc = tiny(make_encoder)
    single = Trainer(enc, make_rows(), train_config(max_steps=4)).train()
    assert [(m["dataset"], m["language"]) for m in single.metrics] == two[0]["groups"]
    # the logged loss is the global batch's (the mean over ranks), the same on every rank and as one process's
    assert two[0]["losses"] == two[1]["losses"]
    assert two[0]["losses"] == pytest.approx([m["loss"] for m in single.metrics], rel=1e-4)
    # fc_k's bias adds the same number to every key score of a head, which the softmax cancels: its true
    # gradient is 0, and Adam turns the rounding noise into lr-sized steps. It cannot change an output.
    irrelevant = {"pooler.fc_k.bias"}
    for name, value in trainable(enc).items():
        if name in irrelevant:
            continue
        torch.testing.assert_close(two[0]["weights"][name], value, rtol=1e-4, atol=2e-5, msg=name)
        torch.testing.assert_close(two[1]["weights"][name], value, rtol=1e-4, atol=2e-5, msg=name)
    before = enc.encode(SNIPPETS, kind="document")
    with torch.no_grad():
        enc.pooler.fc_k.bias.copy_(two[0]["weights"]["pooler.fc_k.bias"])
    np.testing.assert_allclose(enc.encode(SNIPPETS, kind="document"), before, rtol=1e-5, atol=1e-6)


def _draws():
    return torch.rand(3).tolist(), random.random(), float(np.random.rand())


def _resume_and_stop_worker(rank, world, init_file, out, folder):
    import torch.distributed as dist

    import c2llm_lib.train.step as train_mod

    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # a short timeout: a rank left waiting in a collective fails the test instead of hanging it
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))  # fmt: skip
    result = {}
    try:
        cfg = train_config(max_steps=2, checkpoint_steps=[2])
        trainer = Trainer(build_tiny(**TINY_LORA), make_rows(), cfg, folder)
        torch.manual_seed(1000 + rank)  # each rank's own random stream (e.g. its dropout masks)
        random.seed(rank)
        np.random.seed(rank)
        trainer.train()
        result["at_checkpoint"] = _draws()
        resumed = Trainer(build_tiny(**TINY_LORA), make_rows(), cfg, folder)
        resumed.resume(os.path.join(folder, "step-000002"))
        result["resumed"] = _draws()

        real = train_mod.contrastive_loss

        def nan_on_rank_1(*args, **kwargs):
            loss = real(*args, **kwargs)
            if rank == 1:
                loss["loss"] = loss["loss"] * float("nan")
            return loss

        train_mod.contrastive_loss = nan_on_rank_1
        try:
            Trainer(build_tiny(**TINY_LORA), make_rows(), train_config(max_steps=2)).train()
            result["stopped"] = "no error"
        except Exception as err:  # recorded for the test to compare across ranks
            result["stopped"] = f"{type(err).__name__}: {err}"
        out[rank] = result
    finally:
        dist.destroy_process_group()


def test_two_processes_resume_their_own_rng_and_a_nan_on_one_rank_stops_both(tmp_path):
    two = run_processes(_resume_and_stop_worker, 2, str(tmp_path / "checkpoints"))
    assert two[0]["at_checkpoint"] != two[1]["at_checkpoint"]  # the ranks' streams differ...
    for rank in (0, 1):  # ...and each rank continues its own after resuming
        assert two[rank]["resumed"] == two[rank]["at_checkpoint"], rank
    stopped = two[0]["stopped"]
    assert stopped.startswith("NonFiniteLoss: the loss is nan at step 1 (dataset Set") and "on rank 1 of 2" in stopped
    assert two[1]["stopped"] == stopped  # every rank stops, with the same message
