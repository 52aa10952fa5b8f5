"""Command jobs: a program run without a shell, from an argv list; exit code 0 is success.

The job's target is the argv as a JSON list, so no word is ever re-split or
expanded by a shell. argv[0] must be on the node's allow-list exactly as
written (`backup` allows `backup` found on PATH, not `/tmp/backup`). The
payload arrives on stdin, the job's identity in QP_* environment variables,
and the end of stdout and stderr is kept with the run. A line of output
`QP_PROGRESS 0.4 copied 4 of 10` reports the job's progress (JobContext.progress). Stopping a command
terminates its whole process group, then kills it if it lingers past the
job's grace (shortened when its lease is being lost: see JobContext.grace).
"""

import asyncio
import os
import signal
from collections import deque

from ..rules.allow import check_command, parse_argv
from ..store.types import Claimed, JobSpec, Progress
from .base import OUTPUT_LIMIT, Executor, JobContext, JobFailed, excerpt

PROGRESS = b"QP_PROGRESS "  # a line of output that starts so reports progress: "QP_PROGRESS 0.4 copied 4 of 10"
PROGRESS_LINE = 1024  # bytes of an unfinished line kept to read a progress line that arrives in pieces


def reported(line: bytes) -> Progress | None:
    """The progress a line of a command's output reports, if it is a well-formed progress line (a malformed one is
    output like any other, where the operator reads it)."""
    if not line.startswith(PROGRESS):
        return None
    fraction, _, message = line[len(PROGRESS) :].decode("utf-8", "replace").strip().partition(" ")
    try:
        return Progress.of(float(fraction), message.strip() or None)
    except ValueError:
        return None


class CommandExecutor(Executor):
    name = "command"

    def __init__(self, allowed_commands: tuple[str, ...] = ()):
        self.allowed_commands = tuple(allowed_commands)

    def validate(self, spec: JobSpec) -> None:
        check_command(spec.target, self.allowed_commands)

    async def run(self, job: Claimed, context: JobContext) -> str | None:
        self.validate(JobSpec(executor=self.name, target=job.target))
        argv = parse_argv(job.target)
        env = dict(
            os.environ,
            QP_JOB_ID=str(job.id),
            QP_ATTEMPT=str(job.attempts),
            QP_FENCE=str(job.fence),
            QP_MACHINE=str(context.machine_id),
        )
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as error:  # not there, not executable: a retry would fare no better
            permanent = isinstance(error, (FileNotFoundError, PermissionError, NotADirectoryError))
            raise JobFailed(
                f"command {argv[0]!r} could not start: {error.strerror or error}", permanent=permanent
            ) from None
        tail: deque[bytes] = deque()
        try:
            await asyncio.gather(self._feed(process, job.payload), self._collect(process, tail, context))
            code = await process.wait()
        except asyncio.CancelledError:
            context.cancelled.set()
            await self._stop(process, context.grace)
            raise
        output = excerpt(b"".join(tail).decode("utf-8", "replace"))
        if code != 0:
            reason = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            raise JobFailed(f"command {argv[0]!r} failed: {reason}", output)
        return output

    @staticmethod
    async def _feed(process: asyncio.subprocess.Process, payload: str | None) -> None:
        assert process.stdin is not None  # started with stdin=PIPE
        try:
            if payload:
                process.stdin.write(payload.encode())
                await process.stdin.drain()
            process.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the program does not read its input; that is its business

    @staticmethod
    async def _collect(process: asyncio.subprocess.Process, tail: deque[bytes], context: JobContext) -> None:
        """Read all output but keep only its end, so a chatty program cannot fill memory; its progress lines are
        the job's progress (see reported)."""
        assert process.stdout is not None  # started with stdout=PIPE
        kept, line = 0, b""
        while chunk := await process.stdout.read(65536):
            read = line[-PROGRESS_LINE:] + chunk
            if PROGRESS in read:  # one search of the bytes: output without progress lines is not split up
                *ended, line = read.split(b"\n")
                for said in filter(None, map(reported, ended)):
                    context.reported = said
            else:
                line = read[read.rfind(b"\n") + 1 :]
            tail.append(chunk)
            kept += len(chunk)
            while kept - len(tail[0]) >= 4 * OUTPUT_LIMIT:
                kept -= len(tail.popleft())

    @staticmethod
    async def _stop(process: asyncio.subprocess.Process, grace: float) -> None:
        """SIGTERM to the group, SIGKILL after `grace`; over once the program has exited (SIGKILL is certain)."""
        try:
            os.killpg(process.pid, signal.SIGTERM)
            await asyncio.wait_for(asyncio.shield(process.wait()), grace)
            return
        except ProcessLookupError:
            return
        except TimeoutError:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        await asyncio.shield(process.wait())
