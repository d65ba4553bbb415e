"""Retrieval evaluation (paper section 4.2: nDCG@10 on MTEB(Code) and held-out retrieval tasks): the task sets
(`tasks`), our scorer and baselines (`scoring`), mteb's own evaluation (`mteb`, `encoding`, `benchmarks`), intervals
over queries and trainings (`intervals`), and notebook 04's tables (`tables`: `evaluate_set`, one call per task set).
`mteb` and `benchmarks` import mteb, so this face leaves them out."""

from ..retrieval import RetrievalTask, corpus_text, truncate
from .scoring import bm25_query_scores, evaluated_models
from .tables import SetEvaluation, evaluate_set
from .tasks import TaskSets, contamination_note, offline_tasks, task_sets

__all__ = [
    "RetrievalTask", "SetEvaluation", "TaskSets", "bm25_query_scores", "contamination_note", "corpus_text",
    "evaluate_set", "evaluated_models", "offline_tasks", "task_sets", "truncate",
]  # fmt: skip
