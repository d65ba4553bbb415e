"""`python -m c2llm_lib.train`: `cli.main`, with a rank's exception recorded to its torchrun error file."""

from torch.distributed.elastic.multiprocessing.errors import record

from .cli import main

if __name__ == "__main__":
    record(main)()
