"""`python -m c2llm_lib.train`: see `cli.main`. Under torchrun, a rank's exception (message and traceback) goes to its
error file (`record`), where notebook 02's launcher reads it (`launch.diagnose`, in this package)."""

from torch.distributed.elastic.multiprocessing.errors import record

from .cli import main

if __name__ == "__main__":
    record(main)()
