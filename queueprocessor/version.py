"""This release's version, in one place: the build reads it (pyproject.toml), and so do `queueprocessor --version`,
a node's check-in, its metrics and the app's About box."""

__version__ = "0.1.0"
