"""Checkpoints of the trainer on a tiny model: which steps, what notebook 03 merges, restarting notebook 02,
and hostile or broken files (a pickle, truncated files, another model, non-finite weights)."""

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import torch
import yaml

from c2llm_lib.checks import ConfigError
from c2llm_lib.files import CorruptFile
from c2llm_lib.train import (
    STATE_JSON,
    CheckpointMismatch,
    NonFiniteGradients,
    NonFiniteWeights,
    TrainConfig,
    Trainer,
    TrainStep,
    checkpoint_schedule,
    checkpoints_to_merge,
    encoder_from_checkpoint,
    identity_differences,
)
from c2llm_lib.train.checkpoints import apply_weights, read_checkpoint

from conftest import TINY_LORA
from training_rows import make_rows, train_until_killed

# all epochs of the rows (max_steps None) and no checkpoints unless a test asks for them
CFG = dict(global_batch_size=4, num_negatives=2, learning_rate=5e-3, warmup_steps=2, max_length=64, seed=0,
           max_steps=None, checkpoint_steps=[])  # fmt: skip
PARAMS = Path(__file__).resolve().parent.parent / "params"


def train_config(**values) -> TrainConfig:
    """`CFG` with `values` over it."""
    return TrainConfig(**{**CFG, **values})


def tiny(make_encoder, seed=0, **overrides):
    return make_encoder(seed=seed, **{**TINY_LORA, **overrides})


def trainable(encoder):
    return {n: p.detach().clone() for n, p in encoder.named_parameters() if p.requires_grad}


def names(folder):
    return sorted(p.name for p in Path(folder).iterdir() if p.is_dir())


def record(trainer, path):
    """The part of notebook 02's metrics/train.json that notebook 03 reads: the checkpoints, and what identifies the
    training (the same fields as `train.launch.TrainRecord.summary`)."""
    path.write_text(json.dumps({"checkpoints": trainer.checkpoints, "model_config": trainer.encoder.config.to_dict(),
                                "train_config": trainer.cfg.to_dict(), "data_fingerprint": trainer.data_fingerprint,
                                "processes": trainer.world_size}))  # fmt: skip
    return path


# which steps -----------------------------------------------------------------------------------------
def test_fractions_become_steps_of_the_run():
    fractions = TrainConfig(checkpoint_steps=[], checkpoint_fractions=[0.7, 0.8, 0.9, 1.0])
    assert checkpoint_schedule(fractions, 10) == [7, 8, 9, 10]
    assert checkpoint_schedule(fractions, 11000) == [7700, 8800, 9900, 11000]
    assert checkpoint_schedule(fractions, 5) == [4, 5]  # 3.5 -> 4 (half up), 4, 4.5 -> 5, 5: deduplicated
    both = TrainConfig(checkpoint_steps=[2], checkpoint_fractions=[0.5, 1.0])
    assert checkpoint_schedule(both, 10) == [2, 5, 10]
    with pytest.raises(ConfigError, match="checkpoint_fractions"):
        TrainConfig(checkpoint_fractions=[0.0, 1.0])
    with pytest.raises(ConfigError, match="checkpoint_fractions"):
        TrainConfig(checkpoint_fractions=[1.5])


def test_a_checkpoint_step_beyond_the_training_is_an_error_naming_it(make_encoder):
    # 16 rows in two groups of 8, batches of 4: 4 steps per epoch, 12 in 3 epochs; 8000 would never be written
    with pytest.raises(ConfigError, match=r"'checkpoint_steps' \[8000\] lie beyond this training's 12 optimizer steps"):
        Trainer(tiny(make_encoder), make_rows(), train_config(checkpoint_steps=[4, 8000]), "unused")


def test_the_paper_params_merge_four_checkpoints_placed_by_fractions():
    for name in ("c2llm-0.5b", "c2llm-7b"):
        params = yaml.safe_load((PARAMS / f"{name}.yaml").read_text())
        assert params["checkpoint_steps"] == [] and params["checkpoint_fractions"] == [0.7, 0.8, 0.9, 1.0], name
        assert params["merge_last"] == len(params["checkpoint_fractions"]), name


def test_n_steps_with_four_fractions_checkpoint_four_steps_ending_at_n_and_merge_exactly_those(make_encoder, tmp_path):
    root = tmp_path / "checkpoints"
    stale = root / "step-000012"  # an earlier, longer training's last checkpoint (an older format)
    (stale / "adapter").mkdir(parents=True)
    (stale / "trainer_state.pt").write_bytes(b"older training")
    cfg = train_config(max_steps=10, checkpoint_fractions=[0.7, 0.8, 0.9, 1.0])
    trainer = Trainer(tiny(make_encoder), make_rows(), cfg, root)
    note = trainer.resume_latest()
    assert "nothing in it records which training wrote it" in note and "training from step 0" in note
    trainer.train()
    assert trainer.save_final().endswith("step-000010")  # 1.0 is the last step: no extra final checkpoint
    expected = ["step-000007", "step-000008", "step-000009", "step-000010"]
    assert names(root) == expected
    (moved,) = tmp_path.glob("checkpoints.replaced-*")  # the old checkpoint is kept, aside
    assert (moved / "step-000012" / "trainer_state.pt").read_bytes() == b"older training"
    chosen = checkpoints_to_merge(record(trainer, tmp_path / "train.json"), root, 4)
    assert [p.name for p in chosen] == expected
    with pytest.raises(ValueError, match=r"wrote 4 checkpoint\(s\).*fewer than merge_last = 5"):
        checkpoints_to_merge(tmp_path / "train.json", root, 5)


def test_notebook_03_merges_only_the_checkpoints_of_the_recorded_training(make_encoder, tmp_path):
    """A shorter re-training in a folder that still holds a longer training's step 4 merges its own 2 and 3."""
    root = tmp_path / "checkpoints"
    old = Trainer(tiny(make_encoder), make_rows(), train_config(max_steps=4, checkpoint_steps=[2, 3, 4]), root)
    old.train()
    shorter = Trainer(tiny(make_encoder), make_rows(), train_config(max_steps=3, checkpoint_steps=[2]), root)
    shorter.train()
    shorter.save_final()
    assert names(root) == ["step-000002", "step-000003", "step-000004"]  # the folder mixes the two trainings
    chosen = checkpoints_to_merge(record(shorter, tmp_path / "train.json"), root, 2)
    assert [p.name for p in chosen] == ["step-000002", "step-000003"]


def test_notebook_03_refuses_a_checkpoint_copied_in_from_another_training(make_encoder, tmp_path):
    """A checkpoint of another learning rate, copied over one the record lists (names, sizes and times kept), is
    named with what differs instead of being merged (issue 23)."""
    import shutil

    root, other = tmp_path / "checkpoints", tmp_path / "other"
    cfg = train_config(max_steps=3, checkpoint_steps=[2, 3])
    ours = Trainer(tiny(make_encoder), make_rows(), cfg, root)
    ours.train()
    Trainer(tiny(make_encoder), make_rows(), dataclasses.replace(cfg, learning_rate=7e-3), other).train()
    train_json = record(ours, tmp_path / "train.json")
    assert [p.name for p in checkpoints_to_merge(train_json, root, 2)] == ["step-000002", "step-000003"]
    shutil.rmtree(root / "step-000003")
    shutil.copytree(other / "step-000003", root / "step-000003")  # copy2: sizes and modification times kept
    with pytest.raises(
        CheckpointMismatch,
        match=r"step-000003 was written by another training than .*train.json "
        r"records: learning_rate: 0.007 in the checkpoint, 0.005 in the record",
    ):
        checkpoints_to_merge(train_json, root, 2)
    (root / "step-000003" / STATE_JSON).unlink()  # no identity at all: refused too
    with pytest.raises(FileNotFoundError, match="step-000003/trainer_state.json: the trainer state file is missing"):
        checkpoints_to_merge(train_json, root, 2)
    lacking = tmp_path / "lacking.json"  # a record that does not say which training it describes
    lacking.write_text(json.dumps({"checkpoints": ours.checkpoints}))
    with pytest.raises(CorruptFile, match=r"lacking.json: the training record lacks \['model_config'"):
        checkpoints_to_merge(lacking, root, 1)


# restarting notebook 02 --------------------------------------------------------------------------------
def test_a_rerun_resumes_the_same_training_from_its_last_complete_checkpoint(make_encoder, tmp_path, monkeypatch):
    rows, cfg = make_rows(), train_config(max_steps=5, checkpoint_steps=[2, 3])
    straight = tiny(make_encoder)
    expected = Trainer(straight, rows, cfg, tmp_path / "a").train()

    root = tmp_path / "b"
    train_until_killed(Trainer(tiny(make_encoder), rows, cfg, root), 4, monkeypatch)
    (root / "step-000003" / "pooler.safetensors").write_bytes(b"\x00" * 20)  # truncated when the machine died

    rerun_encoder = tiny(make_encoder, seed=99)  # notebook 02 from the top: a fresh encoder
    rerun = Trainer(rerun_encoder, rows, cfg, root)
    note = rerun.resume_latest()
    assert "step-000003 is incomplete or corrupt" in note and "pooler.safetensors" in note
    assert "falling back to the previous one" in note and "Resuming this training from" in note
    assert rerun.step == 2 and "step-000002" in note
    (aside,) = tmp_path.glob("b.corrupt-*")
    assert names(aside) == ["step-000003"]  # moved, not deleted
    result = rerun.train()
    assert [m["loss"] for m in result.metrics] == [m["loss"] for m in expected.metrics]
    for name, value in trainable(straight).items():
        assert torch.equal(value, trainable(rerun_encoder)[name]), name


def test_a_rerun_with_another_config_moves_the_old_checkpoints_aside(make_encoder, tmp_path):
    root = tmp_path / "checkpoints"
    Trainer(tiny(make_encoder), make_rows(), train_config(max_steps=2, checkpoint_steps=[1, 2]), root).train()
    before = {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    other = train_config(learning_rate=1e-3, max_steps=2, checkpoint_steps=[1, 2])
    trainer = Trainer(tiny(make_encoder), make_rows(), other, root)
    note = trainer.resume_latest()
    assert "learning_rate: 0.005 in the checkpoint, 0.001 here" in note and "nothing deleted" in note
    assert trainer.step == 0 and not any(root.iterdir())
    (moved,) = tmp_path.glob("checkpoints.replaced-*")
    assert {p.relative_to(moved): p.read_bytes() for p in moved.rglob("*") if p.is_file()} == before
    trainer.train()
    reordered = make_rows().select(range(15, -1, -1))  # the same rows in another order: another training
    note = Trainer(tiny(make_encoder), reordered, other, root).resume_latest()
    assert "the training rows: fingerprint" in note and len(list(tmp_path.glob("checkpoints.replaced-*"))) == 2


def test_a_checkpoint_older_than_a_setting_resumes_while_the_setting_keeps_its_default(make_encoder, tmp_path):
    """A checkpoint written before `pma_attention_learning_rate` existed lacks the key; at the default (None) it is the
    same training and resumes, set to anything else it is another training, named by the key."""
    root = tmp_path / "checkpoints"
    cfg = train_config(max_steps=3, checkpoint_steps=[1])
    Trainer(tiny(make_encoder), make_rows(), cfg, root).train()
    for state_file in root.glob("step-*/trainer_state.json"):
        state = json.loads(state_file.read_text())
        del state["training"]["train_config"]["pma_attention_learning_rate"]  # as an older version wrote it
        state_file.write_text(json.dumps(state))
    resumed = Trainer(tiny(make_encoder), make_rows(), cfg, root)
    note = resumed.resume_latest()
    assert "Resuming this training from" in note and resumed.step == 1, note
    other = dataclasses.replace(cfg, pma_learning_rate=1e-3, pma_attention_learning_rate=3e-3)
    note = Trainer(tiny(make_encoder), make_rows(), other, root).resume_latest()
    assert "pma_attention_learning_rate: None in the checkpoint, 0.003 here" in note
    crafted = {k: v for k, v in resumed.identity().items() if k != "train_config"}  # no section at all: not defaults
    assert identity_differences(crafted, resumed.identity()) == ["train_config: not recorded in the checkpoint"]


# hostile and broken files ------------------------------------------------------------------------------
class RunsAShellCommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_resume_where_auto_resolves_to_another_dtype_is_refused_naming_both(make_encoder, tmp_path, monkeypatch):
    """`dtype: auto` is a probe's choice per machine: the checkpoint records the dtype it resolved, never "auto", so
    resuming on a machine (or with a probe cache) that picks the other dtype is another training."""
    import c2llm_lib.hardware as hardware

    monkeypatch.setattr(hardware, "auto_dtype", lambda device: (torch.float32, "fp32 measured faster"))
    cfg = train_config(max_steps=2, checkpoint_steps=[2])
    trainer = Trainer(tiny(make_encoder, dtype="auto"), make_rows(), cfg, tmp_path)
    trainer.train()
    saved = json.loads((tmp_path / "step-000002" / "trainer_state.json").read_text())["training"]
    assert saved["model_config"]["dtype"] == "float32"
    monkeypatch.setattr(hardware, "auto_dtype", lambda device: (torch.bfloat16, "bf16 measured faster"))
    elsewhere = Trainer(tiny(make_encoder, dtype="auto"), make_rows(), cfg, tmp_path)
    with pytest.raises(CheckpointMismatch, match="dtype: 'float32' in the checkpoint, 'bfloat16' here"):
        elsewhere.resume(tmp_path / "step-000002")
    assert "dtype: 'float32' in the checkpoint, 'bfloat16' here" in elsewhere.resume_latest()  # moved aside, kept
    assert list(tmp_path.parent.glob(f"{tmp_path.name}.replaced-*"))


def test_a_pickled_trainer_state_is_refused_unread(make_encoder, tmp_path):
    root = tmp_path / "checkpoints"
    Trainer(tiny(make_encoder), make_rows(), train_config(max_steps=1, checkpoint_steps=[1]), root).train()
    checkpoint, marker = root / "step-000001", tmp_path / "pwned"
    for old in checkpoint.glob("trainer_state.*"):
        old.unlink()
    torch.save({"step": RunsAShellCommand(marker)}, checkpoint / "trainer_state.pt")
    trainer = Trainer(tiny(make_encoder), make_rows(), train_config(max_steps=2), root)
    with pytest.raises(CorruptFile, match=r"trainer_state\.pt: a trainer state in pickle format; refusing"):
        trainer.resume(checkpoint)
    assert not marker.exists()


@pytest.mark.parametrize(
    "damaged, problem",
    [
        ("pooler.safetensors", "PMA head file is corrupt or truncated"),
        ("adapter/adapter_model.safetensors", "LoRA adapter file is corrupt or truncated"),
        ("trainer_state.json", "trainer state file is not valid JSON"),
        ("trainer_state.safetensors", "optimizer state file is corrupt or truncated"),
    ],
)
def test_a_truncated_checkpoint_file_is_named_with_what_is_wrong(make_encoder, tmp_path, damaged, problem):
    root = tmp_path / "checkpoints"
    cfg = train_config(max_steps=2, checkpoint_steps=[1])
    Trainer(tiny(make_encoder), make_rows(), cfg, root).train()
    path = root / "step-000001" / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CorruptFile, match=problem) as err:
        Trainer(tiny(make_encoder), make_rows(), cfg, root).resume(root / "step-000001")
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    "damage, problem",
    [
        ("pickle", r"adapter_model.safetensors: the LoRA adapter file is missing, and adapter_model.bin lies in its"),
        ("nan", r"pooler.safetensors: the PMA head file holds non-finite values .*'seed'"),
    ],
)
def test_a_pickled_adapter_or_a_non_finite_head_in_a_checkpoint_is_named(make_encoder, tmp_path, damage, problem):
    from safetensors.torch import load_file, save_file

    root = tmp_path / "checkpoints"
    cfg = train_config(max_steps=2, checkpoint_steps=[1])
    Trainer(tiny(make_encoder), make_rows(), cfg, root).train()
    checkpoint = root / "step-000001"
    if damage == "pickle":
        weights = checkpoint / "adapter" / "adapter_model.safetensors"
        torch.save(load_file(weights), weights.with_suffix(".bin"))
        weights.unlink()
    else:
        head = load_file(checkpoint / "pooler.safetensors")
        head["seed"] = torch.full_like(head["seed"], float("nan"))
        save_file(head, checkpoint / "pooler.safetensors")
    with pytest.raises(CorruptFile, match=problem):
        Trainer(tiny(make_encoder), make_rows(), cfg, root).resume(checkpoint)


def test_resume_refuses_a_checkpoint_of_another_model_naming_the_keys(make_encoder, tmp_path):
    root = tmp_path / "checkpoints"
    cfg = train_config(max_steps=2, checkpoint_steps=[1])
    Trainer(tiny(make_encoder), make_rows(), cfg, root).train()  # pma_heads 4
    eight_heads = Trainer(tiny(make_encoder, pma_heads=8), make_rows(), cfg, root)
    with pytest.raises(CheckpointMismatch, match="pma_heads: 4 in the checkpoint, 8 here"):
        eight_heads.resume(root / "step-000001")
    with pytest.raises(CheckpointMismatch, match="pma_heads: 4 in the checkpoint, 8 here"):
        apply_weights(read_checkpoint(root / "step-000001", with_state=False), tiny(make_encoder, pma_heads=8))


def test_an_infinite_learning_rate_never_writes_a_checkpoint(make_encoder, tmp_path):
    cfg = train_config(max_steps=4, checkpoint_steps=[1])
    cfg.learning_rate = math.inf  # as `learning_rate: .inf` once reached the trainer (the config now refuses it)
    trainer = Trainer(tiny(make_encoder), make_rows(), cfg, tmp_path)
    with pytest.raises(NonFiniteWeights, match=r"update at step 1 .* non-finite.*with finite weights.*none written"):
        trainer.train()
    assert not (tmp_path / "step-000001").exists()


def test_a_non_finite_update_stops_before_its_checkpoint_and_the_last_one_is_good(make_encoder, tmp_path, monkeypatch):
    original = TrainStep.forward_backward  # the loop's step

    def infinite_gradient_at_step_2(self, batch):
        out = original(self, batch)
        if self.step == 1:
            next(p for _, p in self.trained).grad[0, 0] = math.inf  # the loss stays finite
        return out

    monkeypatch.setattr(TrainStep, "forward_backward", infinite_gradient_at_step_2)
    trainer = Trainer(tiny(make_encoder), make_rows(), train_config(max_steps=4, checkpoint_steps=[1, 2]), tmp_path)
    message = r"gradients at step 2 \(dataset Set\d\) are non-finite in 1 of \d+ trainable tensors .* though the loss"
    with pytest.raises(NonFiniteGradients, match=message + r" was finite.*stopping before the update") as caught:
        trainer.train()
    # finite is all the check knows: the message calls the checkpoint neither good nor bad (was "the last good")
    assert str(caught.value).endswith("Last checkpoint written, with finite weights (finite, not necessarily good: "
                                      f"check its loss): {tmp_path / 'step-000001'}")  # fmt: skip
    assert "good checkpoint" not in str(caught.value)
    assert names(tmp_path) == ["step-000001"]
    reloaded = encoder_from_checkpoint(tmp_path / "step-000001", device="cpu")
    assert all(torch.isfinite(p).all() for p in trainable(reloaded).values())


def test_a_zero_head_learning_rate_freezes_the_head(make_encoder):
    encoder = tiny(make_encoder)
    before = trainable(encoder)
    Trainer(encoder, make_rows(), train_config(max_steps=2, pma_learning_rate=0.0)).train()
    after = {n: p.detach() for n, p in encoder.named_parameters()}
    pooler = [n for n in before if n.startswith("pooler.")]
    lora = [n for n in before if "lora_" in n]
    assert pooler and lora
    assert all(torch.equal(before[n], after[n]) for n in pooler)
    assert any(not torch.equal(before[n], after[n]) for n in lora)


def test_the_attention_learning_rate_moves_only_the_seed_wq_and_wk(make_encoder):
    """`pma_attention_learning_rate` trains the parameters of the attention logits (eqs. 1-2) apart: with the rest of
    the head at a negligible rate, AdamW's first steps move S, W_q and W_k by about their own rate, W_v, W_o and the
    norms by next to nothing."""
    encoder = tiny(make_encoder)
    before = trainable(encoder)
    cfg = train_config(max_steps=2, pma_learning_rate=1e-9, pma_attention_learning_rate=1e-2)
    trainer = Trainer(encoder, make_rows(), cfg)
    lrs = sorted(g["initial_lr"] for g in trainer.optimizer.param_groups)  # the peaks (warmup scales "lr")
    assert lrs == [1e-9, CFG["learning_rate"], 1e-2]
    grouped = [id(p) for g in trainer.optimizer.param_groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in encoder.parameters() if p.requires_grad)  # each once, none left out
    trainer.train()
    moved = {n: float((p.detach() - before[n]).abs().max()) for n, p in encoder.named_parameters() if n in before}
    attention = [n for n in moved if n.startswith(("pooler.seed", "pooler.fc_q.", "pooler.fc_k."))]
    rest = [n for n in moved if n.startswith("pooler.") and n not in attention]
    assert len(attention) == 5 and {n.split(".")[1] for n in rest} == {"fc_v", "fc_o", "ln0", "ln1"}
    moved.pop("pooler.fc_k.bias")  # one constant added to every logit of a head, which softmax ignores: no gradient
    assert all(moved[n] > 1e-3 for n in attention if n in moved), {n: moved[n] for n in attention if n in moved}
    assert all(moved[n] < 1e-7 for n in rest), {n: moved[n] for n in rest}


def test_without_an_attention_rate_the_head_is_one_group_and_a_split_run_resumes_exactly(
    make_encoder, tmp_path, monkeypatch
):
    assert len(Trainer(tiny(make_encoder), make_rows(), train_config(max_steps=2)).optimizer.param_groups) == 2
    same = train_config(max_steps=2, pma_learning_rate=1e-3, pma_attention_learning_rate=1e-3)
    assert len(Trainer(tiny(make_encoder), make_rows(), same).optimizer.param_groups) == 2
    rows = make_rows()
    rates = dict(pma_learning_rate=1e-3, pma_attention_learning_rate=3e-3)
    cfg = train_config(max_steps=3, checkpoint_steps=[2], **rates)
    straight = tiny(make_encoder)
    Trainer(straight, rows, cfg, tmp_path / "a").train()
    train_until_killed(Trainer(tiny(make_encoder), rows, cfg, tmp_path / "b"), 3, monkeypatch)
    resumed_encoder = tiny(make_encoder, seed=99)
    resumed = Trainer(resumed_encoder, rows, cfg, tmp_path / "b")
    assert "Resuming this training from" in resumed.resume_latest() and resumed.step == 2
    resumed.train()
    for name, value in trainable(straight).items():  # the three optimizer groups' state came back exactly
        assert torch.equal(value, trainable(resumed_encoder)[name]), name
