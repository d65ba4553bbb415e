"""A small training set in the unified record schema: two (dataset, language) groups of 8 rows; a training killed
part-way."""

import pytest

SNIPPETS = [
    "def add(a, b):\n    return a + b", "def sub(a, b):\n    return a - b", "def mul(a, b):\n    return a * b",
    "def neg(x):\n    return -x", "def inc(x):\n    return x + 1", "def dec(x):\n    return x - 1",
    "def sq(x):\n    return x * x", "def half(x):\n    return x / 2", "def first(xs):\n    return xs[0]",
    "def last(xs):\n    return xs[-1]", "def size(xs):\n    return len(xs)", "def rev(xs):\n    return xs[::-1]",
]  # fmt: skip


def make_rows():
    from datasets import Dataset

    records = []
    for g, language in enumerate(("python", "go")):
        for i, code in enumerate(SNIPPETS[:8]):
            negs = [SNIPPETS[(i + j) % len(SNIPPETS)] for j in (3, 5)]
            records.append(
                {
                    "dataset": f"Set{g}",
                    "language": language,
                    "query": f"task {i} of set {g}: {code[4:9]}",
                    "positive": code + f"  # {g}",
                    "negatives": negs,
                    "instruction": "Find the code:",
                }
            )
    return Dataset.from_list(records)


def train_until_killed(trainer, step, monkeypatch):
    """Trains until the kernel dies as step `step` (1-based) begins."""
    from c2llm_lib.train import TrainStep

    original = TrainStep.forward_backward

    def dies(self, batch):
        if self.step == step - 1:
            raise KeyboardInterrupt("the kernel died")
        return original(self, batch)

    monkeypatch.setattr(TrainStep, "forward_backward", dies)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    monkeypatch.setattr(TrainStep, "forward_backward", original)


def uneven_rows():
    """Two groups of 12 rows whose texts run from a few tokens to past a 48-token max_length, and whose rows hold 0 to
    3 hard negatives: with several processes each rank groups its own texts into a different number of micro-batches
    at some steps, and some rows are short of K = 3."""
    from datasets import Dataset

    records = []
    for g, language in enumerate(("python", "go")):
        codes = [
            f"def f{g}_{i}(a):\n" + "".join(f"    a = a * {j} + {i}\n" for j in range((i * 7) % 6)) + "    return a"
            for i in range(12)
        ]
        for i, code in enumerate(codes):
            records.append(
                {
                    "dataset": f"Set{g}",
                    "language": language,
                    "query": f"compute f{i} of set {g}" + " then add one" * ((i * 5) % 7),
                    "positive": code,
                    "negatives": [codes[(i + 1 + j) % 12] for j in range(i % 4)],  # 0, 1, 2 or 3 negatives
                    "instruction": "Find the code:",
                }
            )
    return Dataset.from_list(records)
