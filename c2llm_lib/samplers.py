"""Grouped batch sampling (paper section 4.1): every global batch comes from one (dataset, language) group.

The plan of an epoch is a pure function of (seed, epoch), computed identically on every rank, so
all ranks draw the same group at the same step and the gathered in-batch negatives never mix
sources. Within a group, rows are shuffled and packed into global batches that contain no
duplicate query and no duplicate positive (a duplicate would be a false negative). A row that
would duplicate is deferred to a later batch. Groups are then interleaved by drawing, at each step,
a group with probability proportional to its batches left. A group's remainder smaller than a
global batch is dropped and counted, never padded by recycling rows (that too makes false
negatives). Rank r takes the r-th slice of each global batch. `state_dict` and
`load_state_dict` carry (epoch, step), so a resumed run continues with the very next batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np


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
    """The rows of each global batch one rank takes: its equal slice. A global batch that the ranks cannot split
    evenly is a ValueError, raised when the sampler is built at rank start (and by the preflight, before a run)."""
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
