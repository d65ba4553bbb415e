"""The former multi-machine command: `python -m c2llm_lib.launch` names `python -m tools.launch` and exits 2."""

import sys

from .train.launch import MACHINE_COMMAND

if __name__ == "__main__":
    print(f"error: the command for each machine of a multi-machine training is {MACHINE_COMMAND}", file=sys.stderr)
    sys.exit(2)
