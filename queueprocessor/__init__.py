"""QueueProcessor: a farm of machines sharing one SQL database drains a job queue together.

The core is headless and Qt-free; see DESIGN.md for the ideas (database time,
turns, leases and fencing) and `queueprocessor.farm` for the Python API.
"""

__version__ = "0.1.0"
