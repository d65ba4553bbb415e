"""Notebook 06's studies behind one call (`run_study`): the peer recipes and the pooling study on equal terms (C2LLM
section 3's takeaway); docs/studies.md#how-the-library-builds-it."""

from .study import Study, run_study

__all__ = ["Study", "run_study"]
