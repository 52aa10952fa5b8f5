"""`python -m ui`: the desktop app."""

from .app import main

main()
