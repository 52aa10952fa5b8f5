"""A module that ends the process when imported, as one that parses argv at import time does (argparse, click)."""

import sys

sys.exit("usage: exits_on_import [options]")


def run(payload, context):  # never reached
    return None
