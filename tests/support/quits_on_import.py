"""A job module that calls sys.exit when it is imported, as a script that parses its command line at import does:
its job must fail, naming SystemExit, and leave the node that imported it running (bench/faults.py sys-exit)."""

import sys

sys.exit(2)


def never(payload, context):
    """Never reached: importing the module ends first."""
