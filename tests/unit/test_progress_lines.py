"""A command's progress lines: read whole even when they arrive in pieces; a malformed one is only output."""

import asyncio

from queueprocessor.executors import CommandExecutor, JobContext
from queueprocessor.executors.command import reported
from queueprocessor.rules.job import Claimed
from queueprocessor.store.types import Progress


def test_a_progress_line_is_read_and_a_malformed_one_ignored():
    assert reported(b"QP_PROGRESS 0.25 copied 1 of 4") == Progress(0.25, "copied 1 of 4")
    assert reported(b"QP_PROGRESS 1") == Progress(1.0, None)
    assert reported(b"QP_PROGRESS 2 too far") is None
    assert reported(b"QP_PROGRESS half") is None
    assert reported(b"progress 0.5") is None


def test_the_latest_progress_line_wins_even_split_across_reads():
    """printf writes its pieces apart (a pipe hands them over as they come): the last complete line is what counts."""
    job = Claimed(1, "command", "", "GET", None, 1, 1, None, 1, 0.0)
    argv = '["sh", "-c", "printf \\"QP_PROGRESS 0.1 a\\\\nQP_PROG\\"; sleep 0.1; printf \\"RESS 0.6 b\\\\nrest\\""]'
    context = JobContext(1, 1, 1, 1)
    output = asyncio.run(CommandExecutor(("sh",)).run(job._replace(target=argv), context))
    assert context.reported == Progress(0.6, "b")
    assert output is not None and output.endswith("rest")
