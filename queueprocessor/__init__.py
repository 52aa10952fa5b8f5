"""QueueProcessor: a farm of machines sharing one SQL database drains a job queue together.

The core is headless and Qt-free; see docs/design.md for the ideas (database time,
turns, leases and fencing) and `queueprocessor.farm` for the Python API.
"""

from typing import TYPE_CHECKING

from .version import __version__

if TYPE_CHECKING:  # the names __getattr__ hands on, as a type checker should see them
    from .farm import Farm
    from .jobfunctions import job

__all__ = ["Farm", "__version__", "job"]


def __getattr__(name: str) -> object:
    """`from queueprocessor import Farm, job` without loading the engine for a bare `import queueprocessor`."""
    if name == "Farm":
        from .farm import Farm

        return Farm
    if name == "job":
        from .jobfunctions import job

        return job
    raise AttributeError(f"module 'queueprocessor' has no attribute {name!r}")
