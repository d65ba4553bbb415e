"""Batches (paper section 4.1): the grouped sampler (each global batch from one (dataset, language) group, the same on
every rank, no duplicate query or positive) and length-grouped micro-batches for padding-free forwards.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

FORWARD_COST_SLOTS = 64  # one forward's fixed cost (per-layer calls, weight packing) in token slots, CPU bf16


def micro_batches(
    lengths: list[int], budget: int, forward_cost: int = FORWARD_COST_SLOTS, max_rows: int | None = None
) -> list[list[int]]:
    """Indices of texts of these token `lengths` in micro-batches, longest first, computing the fewest token slots (plus
    `forward_cost` per forward) within `budget` slots and `max_rows` texts each."""
    if budget < 1:
        raise ValueError(f"a micro-batch needs a token budget of at least 1 slot, got {budget}")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"a micro-batch needs room for at least 1 text, got max_rows={max_rows}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # ties in input order
    longest = [max(1, lengths[i]) for i in order]  # non-increasing
    cost, start = [0] + [math.inf] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):  # the best grouping of order[:end]; its last group is order[first:end]
        for first in range(end - 1, -1, -1):
            rows = end - first
            if rows > 1 and (rows * longest[first] > budget or (max_rows is not None and rows > max_rows)):
                break  # more rows (and a longer first) only grow the slots
            total = cost[first] + forward_cost + rows * longest[first]
            if total <= cost[end]:  # a tie: the fewer forwards
                cost[end], start[end] = total, first
    groups, end = [], len(order)
    while end:
        groups.append(order[start[end] : end])
        end = start[end]
    return groups[::-1]


def length_batches(lengths: list[int], batch_size: int, fill: bool = False) -> list[list[int]]:
    """Inference batches of at most `batch_size` similar-length texts: fewest slots, or with `fill` full batches."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if fill:
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # ties in input order
        return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    return micro_batches(lengths, budget=batch_size * max(1, *lengths), max_rows=batch_size) if lengths else []


# grouped global batches -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    batches: list[list[int]]  # global batches of row indices
    groups: list[tuple[str, str]]  # the group of each batch
    dropped: dict[tuple[str, str], int]  # rows left over per group


def pack_group(
    rows: np.ndarray, query_keys: Sequence[str], positive_keys: Sequence[str], size: int
) -> tuple[list[list[int]], int]:
    """Global batches of `size` rows with no repeated query or positive key; returns (batches, dropped)."""
    batches, pending = [], [int(i) for i in rows]
    while len(pending) >= size:
        batch, seen, rest = [], set(), []
        for i in pending:
            keys = ("q" + query_keys[i], "p" + positive_keys[i])
            if len(batch) < size and not (keys[0] in seen or keys[1] in seen):
                batch.append(i)
                seen.update(keys)
            else:
                rest.append(i)
        if len(batch) < size:  # what is left cannot fill a batch without duplicates
            return batches, len(pending)
        batches.append(batch)
        pending = rest
    return batches, len(pending)


def local_batch_size(global_batch_size: int, world_size: int) -> int:
    """One rank's equal slice of a global batch; a ValueError where the ranks cannot split it evenly."""
    if global_batch_size % world_size:
        raise ValueError(f"global_batch_size {global_batch_size} is not divisible by world_size {world_size}")
    return global_batch_size // world_size


class GroupedBatchSampler:
    """Yields this rank's slice of each global batch; identical group sequence on every rank."""

    def __init__(
        self,
        groups: Sequence[tuple[str, str]],
        query_keys: Sequence[str],
        positive_keys: Sequence[str],
        global_batch_size: int,
        world_size: int = 1,
        rank: int = 0,
        seed: int = 0,
    ) -> None:
        self.local = local_batch_size(global_batch_size, world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if not (len(groups) == len(query_keys) == len(positive_keys)):
            raise ValueError("groups, query_keys and positive_keys must have one entry per row")
        self.groups, self.query_keys, self.positive_keys = list(groups), list(query_keys), list(positive_keys)
        self.global_batch_size, self.world_size, self.rank, self.seed = global_batch_size, world_size, rank, seed
        self.epoch, self.step = 0, 0
        by_group: dict[tuple[str, str], list[int]] = {}
        for i, g in enumerate(self.groups):
            by_group.setdefault(tuple(g), []).append(i)
        self._by_group = {k: np.asarray(v) for k, v in sorted(by_group.items())}

    def plan(self, epoch: int) -> Plan:
        rng = np.random.default_rng([self.seed, epoch])
        queues, dropped = {}, {}
        for group, rows in self._by_group.items():
            batches, left = pack_group(
                rng.permutation(rows), self.query_keys, self.positive_keys, self.global_batch_size
            )
            queues[group], dropped[group] = batches, left
        names = list(queues)
        remaining = np.array([len(queues[g]) for g in names], dtype=float)
        order, groups, cursor = [], [], dict.fromkeys(names, 0)
        while remaining.sum() > 0:
            g = names[int(rng.choice(len(names), p=remaining / remaining.sum()))]
            order.append(queues[g][cursor[g]])
            groups.append(g)
            cursor[g] += 1
            remaining[names.index(g)] -= 1
        return Plan(order, groups, {g: n for g, n in dropped.items() if n})

    def __len__(self) -> int:
        return len(self.plan(self.epoch).batches)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.step = epoch, 0

    def __iter__(self) -> Iterator[list[int]]:
        plan = self.plan(self.epoch)
        local = self.local
        while self.step < len(plan.batches):
            batch = plan.batches[self.step]
            self.step += 1
            yield batch[self.rank * local : (self.rank + 1) * local]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"sampler state has seed {state['seed']}, this sampler {self.seed}: not the same run")
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
