"""Length-grouped batches: the padding-free forwards of training (paper section 4.1) and of evaluation (section 5).

A left-padded forward computes rows x longest token slots, so texts of similar token length go together. Training
groups each step's queries and documents apart (`train.TrainStep.micro_batches`), within a token budget per
micro-batch; the encoder (`C2LLMEncoder.encode`) and the shared baseline pass (`mteb_code.shared_forward`) group
by the same rule (`length_batches`), at most `batch_size` texts per forward: for the same list of distinct texts an
encoder gets the same batches, and so exactly the same embeddings, on either path.
"""

from __future__ import annotations

import math

FORWARD_COST_SLOTS = 64  # one forward's fixed cost (per-layer calls, weight packing) in token slots, CPU bf16


def micro_batches(
    lengths: list[int], budget: int, forward_cost: int = FORWARD_COST_SLOTS, max_rows: int | None = None
) -> list[list[int]]:
    """Indices of texts of these token `lengths` in micro-batches of similar length, longest first: the grouping of
    the length-sorted texts that computes the fewest token slots (rows x longest each, padding included) plus
    `forward_cost` slots per forward, with at most `budget` slots (a longer text runs alone) and at most
    `max_rows` texts per micro-batch. Ties keep the input order, so equal lengths give equal groupings."""
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
    """Inference batches of at most `batch_size` texts of similar token length, longest first: grouped for the
    fewest computed slots (`micro_batches`, on a CPU, where a forward's fixed cost is small), or with `fill` cut
    into full batches of `batch_size` (on an accelerator, where a forward's fixed cost is large: never more
    forwards than fixed batches). Either way a forward holds at most `batch_size` texts no longer than the longest,
    as fixed batches of the sorted texts would."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if fill:
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # ties in input order
        return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    return micro_batches(lengths, budget=batch_size * max(1, *lengths), max_rows=batch_size) if lengths else []
