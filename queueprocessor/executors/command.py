"""Command jobs: a program run without a shell, from an argv list; exit code 0 is success.

The job's target is the argv as a JSON list, so no word is ever re-split or
expanded by a shell. argv[0] must be on the node's allow-list exactly as
written (`backup` allows `backup` found on PATH, not `/tmp/backup`). The
payload arrives on stdin, the job's identity in QP_* environment variables,
and the end of stdout and stderr is kept with the run. A line of output
`QP_PROGRESS 0.4 copied 4 of 10` reports the job's progress (JobContext.progress). Exit code 75 (EX_TEMPFAIL)
snoozes the job without spending an attempt, for the seconds its last line `retry-after: SECONDS` says (else 60).

A command never outlives the lease that covers it (docs/design.md §3). It runs in a process group of its own, held by
the node's warden (executors.warden), a process beside the node that kills the group when its lease stops being
renewed (the node froze, or its loop is blocked) or the node dies: nothing inside the node can promise that, since
whatever stops the node stops its watchdog too. Stopping a command (a cancel, a timeout, a lost lease) is the
warden's too: SIGTERM to the group, SIGKILL once the job's grace is over (shortened when its lease is being lost:
see JobContext.grace), however busy the node's loop is; and its run is recorded only once the program has exited.
When the program ends, what it left running in its group is killed with it.

A command does not inherit the node's environment, which holds the farm's database URL and its password (QP_DB) and
the node's settings: it gets PASSED (those the node has), the variables the node is told to pass through
(`--command-env NAME`), and its own QP_JOB_ID, QP_ATTEMPT, QP_FENCE, QP_MACHINE and QP_QUEUE (and, from a tracing
node, TRACEPARENT: its run's span, docs/design.md §12).
"""

import asyncio
import math
import os
import signal
from collections import deque

from ..rules.allow import check_listed
from ..rules.job import Claimed, JobSpec
from ..rules.kinds import COMMAND, parse_argv
from ..store.types import Progress
from .base import OUTPUT_LIMIT, Executor, JobContext, JobFailed, Snooze, excerpt, seconds_text
from .warden import Leash, Warden

# The node's variables every command gets (those it has): where programs are, who and where it runs, its locale
# (and every LC_*), its zone, its temporary directory. Nothing else of the node's environment, unless named.
PASSED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR")
BACKSTOP = 0.5  # seconds past a stop's grace after which the node kills a group itself (its warden froze)

PROGRESS = b"QP_PROGRESS "  # a line of output that starts so reports progress: "QP_PROGRESS 0.4 copied 4 of 10"
PROGRESS_LINE = 1024  # bytes of an unfinished line kept to read a progress line that arrives in pieces
# Exit code 75 (EX_TEMPFAIL in sysexits.h: "try again later") snoozes the job without spending an attempt, for the
# seconds its last line of output `retry-after: SECONDS` says, else SNOOZE_DELAY (see Snooze).
TEMPFAIL = 75
RETRY_AFTER = b"retry-after:"
SNOOZE_DELAY = 60.0


def asked_delay(line: bytes) -> float | None:
    """The seconds a `retry-after: SECONDS` line of a command's output asks for (None: not such a line, or one whose
    seconds are not a number from 0: output like any other)."""
    if not line.startswith(RETRY_AFTER):
        return None
    try:
        seconds = float(line[len(RETRY_AFTER) :].decode("ascii").strip())
    except ValueError:  # UnicodeDecodeError too
        return None
    return seconds if 0 <= seconds < math.inf else None


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


def passed_environment(names: tuple[str, ...] = ()) -> dict[str, str]:
    """What a command gets of the node's environment: PASSED, every LC_*, and the variables `names`."""
    return {k: v for k, v in os.environ.items() if k in PASSED or k.startswith("LC_") or k in names}


class CommandExecutor(Executor):
    kind = COMMAND
    name = kind.name

    def __init__(self, allowed_commands: tuple[str, ...] = (), command_env: tuple[str, ...] = ()):
        """`command_env`: the names of the node's environment variables its commands also get."""
        self.allowed_commands = tuple(allowed_commands)
        self.env = passed_environment(tuple(command_env))
        self.warden = Warden()

    def validate(self, spec: JobSpec) -> None:
        check_listed(self.kind, spec, self.allowed_commands)

    async def close(self) -> None:
        self.warden.close()

    async def run(self, job: Claimed, context: JobContext) -> str | None:
        self.validate(JobSpec(executor=self.name, target=job.target))
        argv = parse_argv(job.target)
        env = dict(
            self.env,
            QP_JOB_ID=str(job.id),
            QP_ATTEMPT=str(job.attempts),
            QP_FENCE=str(job.fence),
            QP_MACHINE=str(context.machine_id),
            QP_QUEUE=job.queue,
        )
        if context.traceparent is not None:  # a tracing node's run: the command's own spans may join its trace
            env["TRACEPARENT"] = context.traceparent
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
        try:
            leash = self._leash(process.pid, context)
        except OSError as error:  # no warden: the group is killed, not left to run unleashed
            await process.wait()
            raise JobFailed(f"command {argv[0]!r} could not be held to its lease: {error}") from None
        tail: deque[bytes] = deque()
        try:
            _, asked = await asyncio.gather(self._feed(process, job.payload), self._collect(process, tail, context))
            code = await process.wait()
        except asyncio.CancelledError:
            context.cancelled.set()
            await self._stop(process, leash, context.grace)
            raise
        finally:
            leash.free()
        output = excerpt(b"".join(tail).decode("utf-8", "replace"))
        if code == TEMPFAIL:
            said = f"retry-after: {seconds_text(asked)}" if asked is not None else "no retry-after line"
            raise Snooze(
                SNOOZE_DELAY if asked is None else asked, f"command {argv[0]!r} exited {TEMPFAIL} ({said})", output
            )
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
    async def _collect(process: asyncio.subprocess.Process, tail: deque[bytes], context: JobContext) -> float | None:
        """Read all output but keep only its end, so a chatty program cannot fill memory; its progress lines are
        the job's progress (see reported). Returns the seconds of its last `retry-after:` line (see asked_delay)."""
        assert process.stdout is not None  # started with stdout=PIPE
        kept, line, asked = 0, b"", None
        while chunk := await process.stdout.read(65536):
            read = line[-PROGRESS_LINE:] + chunk
            if PROGRESS in read or RETRY_AFTER in read:  # one search each: other output is not split up
                *ended, line = read.split(b"\n")
                for text in ended:
                    if (said := reported(text)) is not None:
                        context.reported = said
                    elif (seconds := asked_delay(text)) is not None:
                        asked = seconds
            else:
                line = read[read.rfind(b"\n") + 1 :]
            tail.append(chunk)
            kept += len(chunk)
            while kept - len(tail[0]) >= 4 * OUTPUT_LIMIT:
                kept -= len(tail.popleft())
        last = asked_delay(line)  # the last line, unfinished
        return asked if last is None else last

    def _leash(self, pgid: int, context: JobContext) -> Leash:
        """Hold the group with the warden until the run's deadline. A renewal that came meanwhile did not see the
        leash (JobRunner.renewed sets the deadline, then extends the leash it finds): its deadline is passed on."""
        deadline = context.deadline
        context.leash = leash = self.warden.hold(pgid, deadline)
        if context.deadline != deadline:
            leash.extend(context.deadline)
        return leash

    @staticmethod
    async def _stop(process: asyncio.subprocess.Process, leash: Leash, grace: float) -> None:
        """Stop the program: the warden SIGTERMs its group and SIGKILLs it after `grace`. Over once it has exited,
        and only then: a further cancellation meanwhile (a timeout and a stop meeting) is swallowed, the caller
        raising once the program is gone, so its run is never recorded while it lives. Should the warden not have
        killed it BACKSTOP after the grace (it froze), the node does."""
        leash.stop(grace)
        loop = asyncio.get_running_loop()
        exited = loop.create_task(process.wait())
        backstop: float | None = loop.time() + grace + BACKSTOP
        while not exited.done():
            try:
                await asyncio.wait({exited}, timeout=None if backstop is None else max(0.0, backstop - loop.time()))
            except asyncio.CancelledError:
                continue
            if not exited.done() and backstop is not None and loop.time() >= backstop:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                backstop = None
