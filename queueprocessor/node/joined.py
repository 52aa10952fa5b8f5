"""What a node's threads (its heartbeat and its turn timer) read of the node they work for: its machine id and its
runner, which exist by the time either thread runs (the node joins the farm and starts its runner first)."""

from typing import Protocol

from .runner import JobRunner


class Joined(Protocol):
    id: int | None
    runner: JobRunner | None


class OfJoinedNode:
    """Base of Heartbeat and TurnTimer: the two reads each of them needs of its node, said once."""

    node: Joined

    @property
    def _me(self) -> int:
        """Our machine id: the node's threads run only once it has joined the farm."""
        assert self.node.id is not None
        return self.node.id

    @property
    def _runner(self) -> JobRunner:
        """The node's runner, which it starts before its heartbeat and turn timer."""
        assert self.node.runner is not None
        return self.node.runner
