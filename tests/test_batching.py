"""Length-grouped batches (batching.py): known groupings, invariants over random lengths, and the batches that
`C2LLMEncoder.encode` and the shared baseline pass (`eval.encoding.shared_forward`) really run."""

import random

import numpy as np
import pytest

from c2llm_lib.batching import FORWARD_COST_SLOTS, length_batches, micro_batches


def cost(lengths: list[int], groups: list[list[int]]) -> int:
    """Token slots computed (rows x longest, padding included) plus the fixed cost of each forward."""
    return sum(len(g) * max(lengths[i] for i in g) + FORWARD_COST_SLOTS for g in groups)


def test_known_groupings():
    assert micro_batches([10] * 5, budget=1000, max_rows=2) == [[0], [1, 2], [3, 4]]  # 3 forwards either way
    # 3 long together, 2 short together: 300 + 8 slots and 2 forwards beat one padded forward (500 + 1)
    assert length_batches([100, 3, 99, 4, 98], batch_size=16) == [[0, 2, 4], [3, 1]]
    assert length_batches([7, 5, 7, 7, 7], batch_size=2) == [[0, 2], [3, 4], [1]]  # equal lengths in input order
    assert length_batches([0, 0], batch_size=4) == [[0, 1]]  # empty texts (no prefix, no EOS) still batch
    assert length_batches([], batch_size=4) == []
    with pytest.raises(ValueError, match="batch_size must be positive, got 0"):
        length_batches([1], 0)
    with pytest.raises(ValueError, match="max_rows=0"):
        micro_batches([1], budget=10, max_rows=0)


@pytest.mark.parametrize("seed", range(20))
def test_groups_cover_every_text_once_and_never_cost_more_than_fixed_sorted_batches(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(1, 40), rng.randint(1, 512)]) for _ in range(rng.randint(1, 120))]
    batch_size = rng.randint(1, 20)
    groups = length_batches(lengths, batch_size)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(1 <= len(g) <= batch_size for g in groups)
    ordered = [lengths[i] for g in groups for i in g]
    assert ordered == sorted(lengths, reverse=True)  # longest first, groups of neighbours
    # full batches of the length-sorted texts (`fill`; better than what encode ran before: batches sorted by characters)
    fixed = length_batches(lengths, batch_size, fill=True)
    assert [len(g) for g in fixed[:-1]] == [batch_size] * (len(fixed) - 1)
    assert [lengths[i] for g in fixed for i in g] == sorted(lengths, reverse=True)
    assert cost(lengths, groups) <= cost(lengths, fixed)


def token_texts(encoder, lengths: list[int]) -> list[str]:
    """Documents whose formatted text tokenises to exactly each of `lengths` tokens (" x" is one token)."""
    prefix = encoder.config.document_prefix
    base = len(encoder.tokenizer(prefix + "def", add_special_tokens=False)["input_ids"])
    texts = ["def" + " x" * (n - base) for n in lengths]
    assert encoder.token_lengths(encoder.format_texts(texts, "document")) == lengths
    return texts


def backbone_shapes(encoder) -> list[tuple[int, int]]:
    """(rows, width) of every batch that goes through the encoder's backbone from now on."""
    seen = []
    encoder.backbone.register_forward_hook(
        lambda module, args, kwargs, out: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return seen


def test_encode_runs_the_length_groups_and_keeps_input_order(make_encoder):
    encoder = make_encoder(pma_heads=4)
    lengths = [30, 7, 6, 29, 5]
    texts = token_texts(encoder, lengths)
    seen = backbone_shapes(encoder)
    grouped = encoder.encode(texts, kind="document", batch_size=4)
    # one fixed batch of the sorted texts would compute 4 x 30 + 1 x 5 slots; the groups compute 2 x 30 + 3 x 7
    assert seen == [(2, 30), (3, 7)]
    alone = np.concatenate([encoder.encode([t], kind="document") for t in texts])  # (5, d), one text per forward
    np.testing.assert_allclose(grouped, alone, rtol=1e-4, atol=1e-5)


def test_token_lengths_count_the_appended_eos_and_the_cut(make_encoder):
    encoder = make_encoder(pooling="last_token")
    texts = token_texts(make_encoder(pma_heads=4), [5, 20])  # without EOS: 5 and 20 tokens
    formatted = encoder.format_texts(texts, "document")
    assert encoder.token_lengths(formatted, max_length=12) == [6, 12]  # EOS after the text, and after the cut
    assert encoder.token_lengths(formatted, max_length=12, chunk=1) == [6, 12]
    batch = encoder.tokenize_formatted(formatted, 12)
    assert batch["attention_mask"].sum(-1).tolist() == [6, 12]  # what the forward really reads
    with pytest.raises(ValueError, match="max_length=1 leaves no room"):
        encoder.token_lengths(formatted, max_length=1)


def test_the_shared_pass_runs_encodes_batches_also_with_eos_and_cut_texts(make_encoder):
    """last-token pooling appends EOS after the cut: the shared pass must count the same lengths as encode, so that
    an encoder alone gets encode's batches (and so its embeddings, exactly)."""
    from c2llm_lib.eval.encoding import shared_forward

    encoder = make_encoder(pooling="last_token")
    texts = token_texts(make_encoder(pma_heads=4), [5, 30, 11, 12, 13, 6, 29])  # cut at 12 (11 + EOS)
    kwargs = {"kind": "document", "batch_size": 3, "max_length": 12}
    seen = backbone_shapes(encoder)
    alone = encoder.encode(texts, normalize=False, **kwargs)
    from_encode, seen[:] = list(seen), []
    (shared,), sequences = shared_forward([encoder], encoder.format_texts(texts, "document"), 12, batch_size=3)
    assert seen == from_encode and sequences == len(texts)
    assert seen == [(2, 12), (3, 12), (2, 7)]  # five texts read 12 tokens (cut, or 11 + EOS), two read 7 and 6
    np.testing.assert_array_equal(shared, alone)
