"""`python -m c2llm_lib.launch`, the former command for each machine of a multi-machine training: it names its
replacement, `python -m tools.launch` (docs/training.md, several machines), and exits with status 2. Notebook 02's
launcher is `c2llm_lib.train.launch`."""

import sys

from .train.launch import MACHINE_COMMAND

if __name__ == "__main__":
    print(f"error: the command for each machine of a multi-machine training is {MACHINE_COMMAND}", file=sys.stderr)
    sys.exit(2)
