"""`python -m tools.preflight PARAMS ...`: the preflight's command (`run.cli`)."""

import sys

from .run import cli

sys.exit(cli())
