"""Grouped batch sampler: one group per global batch, the same on every rank, no duplicates, resumable."""

from collections import Counter

import pytest

from c2llm_lib.batching import GroupedBatchSampler, pack_group


def rows(n_per_group=(12, 8, 20)):
    groups, qk, pk = [], [], []
    for g, n in enumerate(n_per_group):
        for i in range(n):
            groups.append((f"data{g}", "python" if g % 2 == 0 else "go"))
            qk.append(f"q{g}-{i}")
            pk.append(f"p{g}-{i}")
    return groups, qk, pk


def test_each_global_batch_is_one_group_and_ranks_agree():
    groups, qk, pk = rows()
    samplers = [GroupedBatchSampler(groups, qk, pk, 4, world_size=2, rank=r, seed=3) for r in range(2)]
    plan = samplers[0].plan(0)
    assert plan.groups == samplers[1].plan(0).groups
    slices = [list(s) for s in samplers]
    for step, (a, b) in enumerate(zip(*slices, strict=True)):
        assert len(a) == len(b) == 2 and not set(a) & set(b)
        assert len({groups[i] for i in a + b}) == 1 and groups[a[0]] == plan.groups[step]
    assert sum(len(b) for b in plan.batches) == 40  # 12, 8, 20 rows: all divisible by 4, nothing dropped


def test_no_duplicate_query_or_positive_in_a_global_batch():
    groups = [("d", "python")] * 8
    qk = ["same", "same", "a", "b", "c", "d", "e", "f"]
    pk = ["p0", "p1", "p2", "p2", "p4", "p5", "p6", "p7"]
    batches, dropped = pack_group(list(range(8)), qk, pk, 4)
    for batch in batches:
        assert len({qk[i] for i in batch}) == 4 and len({pk[i] for i in batch}) == 4
    assert sum(map(len, batches)) + dropped == 8
    plan = GroupedBatchSampler(groups, qk, pk, 4, seed=0).plan(0)
    assert all(len({qk[i] for i in b}) == len(b) for b in plan.batches)


def test_remainders_are_dropped_and_counted_never_recycled():
    groups, qk, pk = rows((10, 6))
    plan = GroupedBatchSampler(groups, qk, pk, 4, seed=0).plan(0)
    used = [i for b in plan.batches for i in b]
    assert len(used) == len(set(used)) == 12
    assert plan.dropped == {("data0", "python"): 2, ("data1", "go"): 2}


def test_deterministic_given_seed_and_epoch():
    groups, qk, pk = rows()
    a = GroupedBatchSampler(groups, qk, pk, 4, seed=1)
    b = GroupedBatchSampler(groups, qk, pk, 4, seed=1)
    assert a.plan(0) == b.plan(0) and a.plan(1) == b.plan(1) and a.plan(0) != a.plan(1)
    assert GroupedBatchSampler(groups, qk, pk, 4, seed=2).plan(0) != a.plan(0)


def test_resume_mid_epoch_continues_with_the_next_batch():
    groups, qk, pk = rows()
    full = list(GroupedBatchSampler(groups, qk, pk, 4, seed=5))
    first = GroupedBatchSampler(groups, qk, pk, 4, seed=5)
    it = iter(first)
    head = [next(it) for _ in range(4)]
    state = first.state_dict()
    resumed = GroupedBatchSampler(groups, qk, pk, 4, seed=5)
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    with pytest.raises(ValueError, match="not the same run"):
        GroupedBatchSampler(groups, qk, pk, 4, seed=6).load_state_dict(state)


def test_groups_are_drawn_in_proportion_to_what_is_left():
    groups, qk, pk = rows((400, 40))
    firsts = Counter(GroupedBatchSampler(groups, qk, pk, 4, seed=s).plan(0).groups[0] for s in range(200))
    assert firsts[("data0", "python")] > 5 * firsts[("data1", "go")]  # 100 batches vs 10: ~91 % vs ~9 %


def test_bad_arguments():
    groups, qk, pk = rows()
    with pytest.raises(ValueError, match="divisible"):
        GroupedBatchSampler(groups, qk, pk, 5, world_size=2)
    with pytest.raises(ValueError, match="one entry per row"):
        GroupedBatchSampler(groups, qk[:-1], pk, 4)
