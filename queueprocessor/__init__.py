"""QueueProcessor: a farm of machines sharing one SQL database drains a job queue together.

The core is headless and Qt-free; see docs/design.md for the ideas (database time, turns, leases and fencing),
`queueprocessor.farm` for the Python API and docs/api.md for all of it on one page.

The public names are listed once, in `__all__`. `__getattr__` loads one from its home (the first of `_HOMES`
that has it: the pure rules first, the engine last) when it is first asked for, so a bare `import queueprocessor`
(the CLI's first step) loads no engine. The imports under TYPE_CHECKING are the same names for a type checker;
tests/unit/test_api_doc.py holds them to `__all__`.
"""

import importlib
from typing import TYPE_CHECKING

from .version import __version__

__all__ = [
    "__version__",
    "Farm",
    "Enqueued",
    "job",
    "JobFunction",
    "JobSpec",
    "JobOptions",
    "work_spec",
    "JobFilter",
    "Rate",
    "OnFailure",
    "QueueInfo",
    "KeyUse",
    "ScheduleChanges",
    "SchedulePolicy",
    "JobState",
    "Outcome",
    "MachineState",
    "Wish",
    "QPError",
    "InputError",
    "BadJobInput",
    "BadQueueInput",
    "BadSetting",
    "NotFound",
    "InvalidJob",
    "NotAllowed",
    "ReadOnly",
    "ConfigError",
    "DatabaseUnavailable",
    "SchemaTooNew",
    "AlreadyTaken",
    "LockHeld",
]

# Where the names of __all__ live, lightest first: a name is taken from the first that has it.
_HOMES = (
    "rules.errors",
    "rules.states",
    "rules.job",
    "rules.search",
    "rules.queues",
    "rules.fairness",
    "jobfunctions",
    "grabs",
    "singletons",
    "jobs",
    "schedulesteer",
    "farm",
)

if TYPE_CHECKING:  # the names __getattr__ hands on, as a type checker should see them
    from .farm import Farm
    from .grabs import AlreadyTaken
    from .jobfunctions import JobFunction, job
    from .jobs import Enqueued
    from .rules.errors import (
        BadJobInput,
        BadQueueInput,
        BadSetting,
        ConfigError,
        DatabaseUnavailable,
        InputError,
        InvalidJob,
        NotAllowed,
        NotFound,
        QPError,
        ReadOnly,
        SchemaTooNew,
    )
    from .rules.fairness import KeyUse
    from .rules.job import JobOptions, JobSpec, work_spec
    from .rules.queues import OnFailure, QueueInfo, Rate
    from .rules.search import JobFilter
    from .rules.states import JobState, MachineState, Outcome, Wish
    from .schedulesteer import ScheduleChanges, SchedulePolicy
    from .singletons import LockHeld


def __getattr__(name: str) -> object:
    """`from queueprocessor import Farm, job` without loading the engine for a bare `import queueprocessor`."""
    if name in __all__:
        for home in _HOMES:
            module = importlib.import_module(f".{home}", __name__)
            if hasattr(module, name):
                return getattr(module, name)
    raise AttributeError(f"module 'queueprocessor' has no attribute {name!r}")
