"""How the app judges a named queue at a glance: the state its row and chart show (coloured in theme.QUEUE_STATE)."""

from enum import StrEnum

from queueprocessor.rules.queues import QueueInfo


class QueueState(StrEnum):
    """An operator paused the queue, no live machine serves it (its jobs are accepted but wait), or it is
    being worked."""

    ACTIVE = "active"
    PAUSED = "paused"
    UNSERVED = "unserved"

    @classmethod
    def of(cls, info: QueueInfo) -> "QueueState":
        if info.paused:
            return cls.PAUSED
        return cls.ACTIVE if info.serving else cls.UNSERVED
