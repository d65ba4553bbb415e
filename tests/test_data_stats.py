"""Statistics for notebook 01 (decontamination against mteb's mock task: test_data_decontamination.py)."""

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from c2llm_lib.data.stats import length_frame, length_histograms, row_counts  # noqa: E402

ROWS = [
    {"dataset": "A", "language": "python", "query": "q" * 10, "positive": "p" * 100},
    {"dataset": "A", "language": "python", "query": "q" * 20, "positive": "p" * 200},
    {"dataset": "B", "language": "go", "query": "q" * 30, "positive": "p" * 300},
]


def test_row_counts_known_answer():
    counts = row_counts(ROWS)
    assert counts.to_dict("records") == [
        {"dataset": "A", "language": "python", "rows": 2, "share": 2 / 3},
        {"dataset": "B", "language": "go", "rows": 1, "share": 1 / 3},
    ]


def test_lengths_and_histogram_figure():
    frame = length_frame(ROWS)
    assert sorted(frame[frame["field"] == "positive"]["chars"]) == [100, 200, 300]
    assert isinstance(length_histograms(ROWS), Figure)
