"""`python -m queueprocessor.cli`: the command, as the installed script runs it."""

from . import main

main()
