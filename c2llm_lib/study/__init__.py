"""Notebook 06's studies behind one call (`run_study`): the peer recipes and the pooling study on equal terms (C2LLM
section 3's takeaway). Modules: `plan` (what trains), `validation` and `sweep` (rates chosen on validation),
`trainings` (each training in its own process, its cached scores), `recipes` and `pooling` (tables, sentences,
records, figures), `study` (the call).
"""

from .study import Study, run_study

__all__ = ["Study", "run_study"]
