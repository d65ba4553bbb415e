"""Notebook 06's studies behind one call (`run_study`): the peer recipes and the pooling study on equal terms (C2LLM
section 3's takeaway). Modules: `plan` (what trains), `validation` and `sweep` (rates chosen on validation),
`trainings` (each training in its own process, its cached scores), `recipes` and `pooling` (tables, sentences,
records, figures), `study` (the call). `variants`, `train_variant` and `ablation_pairs` train and compare the
poolers in the kernel at one rate and seed (notebook 04's former quick check; the tests use them).
"""

from .pooling import ablation_pairs, train_variant, variants
from .study import Study, run_study

__all__ = ["Study", "ablation_pairs", "run_study", "train_variant", "variants"]
