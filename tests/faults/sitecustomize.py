"""Fault injection for the multi-process tests (tests/test_launch.py), kept out of the library.

A test puts this folder on PYTHONPATH, so that every Python process of the run (the notebook's kernel, torchrun,
each rank) imports this module at start. In a torchrun rank (RANK is set) whose global rank is `C2LLM_FAULT_RANK`,
the trainer fails after its first step: raising (`C2LLM_FAULT=raise`, the default) or exiting at once with status 3
(`C2LLM_FAULT=exit`), so that the tests see how a dead rank is reported; with `C2LLM_FAULT=dtype` that rank's
`dtype: auto` probe picks float16 instead, as a machine with another CPU or a stale probe cache would. Anywhere
else it does nothing.
"""

import os
import sys

FAULT_RANK, FAULT_MODE = os.environ.get("C2LLM_FAULT_RANK"), os.environ.get("C2LLM_FAULT", "raise")

if FAULT_RANK is not None and os.environ.get("RANK") == FAULT_RANK and FAULT_MODE == "dtype":
    import torch

    from c2llm_lib import hardware

    hardware.auto_dtype = lambda device: (torch.float16, "a probe on another machine")
elif FAULT_RANK is not None and os.environ.get("RANK") == FAULT_RANK:
    from c2llm_lib.train import loop

    _train = loop.Trainer.train

    def _faulty_train(self, on_step=None, progress=True):
        def fault(metrics):
            if on_step is not None:
                on_step(metrics)
            if metrics["step"] != 1:
                return
            if FAULT_MODE == "exit":
                print(f"rank {self.rank}: injected fault, exiting with status 3", file=sys.stderr, flush=True)
                os._exit(3)
            raise RuntimeError(f"injected fault on rank {self.rank} after step 1 (C2LLM_FAULT_RANK)")

        return _train(self, on_step=fault, progress=progress)

    loop.Trainer.train = _faulty_train
