"""Preflight: before a long run, know in minutes that it will finish, fit and be fast, without writing into its run
directory (`python -m tools.preflight params/<run>.yaml`, `make preflight PARAMS=...`). A tool beside the library: it
imports c2llm_lib, and the library never imports it.

It checks the recipe of the paper's section 4.1 (LoRA contrastive training of the section 3 encoder, K hard
negatives, the global batch over every GPU, checkpoints merged) and section 4.2's evaluation as this machine would run
them, one `Check` per line (pass, warn or fail, the figure behind it, and the setting to change):

1. environment (`environment.py`): CUDA and its devices, bf16, the attention kernel for this dtype (without
   flash-attention, the slowdown to expect), NCCL or gloo for several processes, the installed libraries against
   pyproject.toml;
2. inputs (`inputs.py`): the training data the run's data_source names (every hub source at its pinned revision, in
   `hub_mirror` or reachable, with its size; or the user's data_files or code_roots, read by notebook 01's readers)
   and every evaluation dataset; the backbone's files and revision; a release to evaluate; the schedule against the
   rows and the ranks (the sampler's rule), and where it refuses the training batch, the steps below that take it are
   not run;
3. memory (`device.py`, measured by `probe.py` in a child process per device): the largest batch the recipe can see,
   every text at max_length, one forward and backward with the peak measured; a failure names the measured setting
   that fits;
4. speed (`device.py`): timed optimizer steps at the real sizes, tokens/s and MFU against the GEMM peak measured in the
   same process, and the projected wall time of the training and the evaluation;
5. writes (`disk.py`): the outputs folder writable, the run directory free, room on every filesystem for the data mix,
   checkpoints and merged model, a checkpoint round trip;
6. processes (`processes.py`): with nproc > 1, the ranks start, agree on the recipe and dtype, and time one gathered
   step; with several machines, the rendezvous endpoint resolves.

The report (`report.py`) is printed as a table and saved as `<outputs>/<run>.preflight.json` (`report.save_preflight`);
`run.py` puts the checks together. `Limits` caps what a check may use (a memory or disk budget, a quota), which is also
how the tests break each check on purpose.
"""

from .report import Check, Limits, Report
from .run import cli, main, run_preflight

__all__ = ["Check", "Limits", "Report", "cli", "main", "run_preflight"]
