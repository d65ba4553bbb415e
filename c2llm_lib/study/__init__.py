"""Notebook 06's studies behind one call (`run_study`): the peer recipes and the pooling study on equal terms (C2LLM
section 3's takeaway). Modules: `plan` (what trains), `validation` and `sweep` (rates chosen on validation),
`trainings` (each training in its own process, its cached scores), `recipes` and `pooling` (tables, sentences,
records, figures), `study` (the call). Notebook 04's quick pooling check imports `variants`, `train_variant` and
`ablation_pairs` from here.
"""

from .pooling import ablation_pairs, train_variant, variants
from .study import Study, run_study

__all__ = ["Study", "ablation_pairs", "run_study", "train_variant", "variants"]
