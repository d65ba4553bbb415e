"""Retrieval evaluation (paper section 4.2, nDCG@10): task sets (`tasks`), our scorer and baselines (`scoring`), mteb's
evaluation (`mteb`, `encoding`, `benchmarks`), intervals (`intervals`) and notebook 04's tables (`tables`). `mteb` and
`benchmarks` import mteb, so this face leaves them out."""

from ..retrieval import RetrievalTask, corpus_text, truncate
from .scoring import bm25_query_scores, evaluated_models
from .tables import SetEvaluation, evaluate_set
from .tasks import TaskSets, contamination_note, offline_tasks, task_sets

__all__ = [
    "RetrievalTask", "SetEvaluation", "TaskSets", "bm25_query_scores", "contamination_note", "corpus_text",
    "evaluate_set", "evaluated_models", "offline_tasks", "task_sets", "truncate",
]  # fmt: skip
