"""The warden: a small process beside each node that holds its command jobs' process groups on a leash.

The rule (docs/design.md §3): no work of a job outlives the lease that covers it. A command runs outside its node's
process, so nothing inside the node (its watchdog, its event loop) can keep that promise when the node itself is
killed (SIGKILL, the OOM killer, a crash), frozen (SIGSTOP, a paused VM) or its loop blocked by a job. The warden
shares none of those fates. It keeps, for each command's process group, the time by which its work must be dead; the
node pushes that time back at every renewal of the run's lease, from its heartbeat thread (never through its loop).
A group whose time passes is SIGKILLed: its node stopped renewing, and stopping. When the warden's pipe from its node
closes (the node died), it SIGTERMs every group at once and SIGKILLs them ORPHAN_GRACE later, never past a deadline.

It is started with the node's first command job, as `python -I -S warden.py` in a session of its own (a terminal's
Ctrl-C or Ctrl-Z reaches the node, not it), and imports nothing of the project nor of site, so it starts in
milliseconds. The node speaks to it on its stdin, one line per message, each far shorter than PIPE_BUF, so lines
written by several of the node's threads never interleave:

    hold <pgid> <seconds>    a new command's group, whose work may live `seconds` more
    extend <pgid> <seconds>  its lease was renewed: it may live `seconds` from now (a deadline never moves earlier)
    stop <pgid> <grace>      SIGTERM the group now, SIGKILL it `grace` later (or at its deadline, if sooner)
    free <pgid>              its command ended: SIGKILL what is left of its group, and forget it

Seconds are relative, turned into the warden's own monotonic clock as the line is read (a line read late moves its
deadline later by the microseconds it waited in the pipe). A group is only ever signalled while held: after `free`,
its number may belong to someone else.

The node's side is Warden (one per CommandExecutor, so per node) and its Leash on each command.
"""

import logging
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref

ORPHAN_GRACE = 1.0  # seconds the commands of a node that died get to end by themselves before they are killed
CLOSE_WAIT = 5.0  # seconds a stopping node waits for its warden to end

log = logging.getLogger("queueprocessor.warden")


# -- the warden process ---------------------------------------------------------------------------------------------


def _signal(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already (or what is left of it is not ours to signal)


class Groups:
    """The warden's state: each held group's kill time (on the warden's monotonic clock), and which are stopping."""

    def __init__(self) -> None:
        self.kill_at: dict[int, float] = {}
        self.stopping: set[int] = set()

    def heard(self, line: bytes, now: float) -> None:
        """Act on one line from the node; a line it cannot read is ignored (the node never writes one)."""
        try:
            verb, pgid_text, seconds_text = line.split()
            pgid, seconds = int(pgid_text), float(seconds_text)
        except ValueError:
            return
        if pgid <= 1 or math.isnan(seconds):  # never our own group, nor init's
            return
        if verb == b"hold":
            self.kill_at[pgid] = now + seconds
            self.stopping.discard(pgid)
        elif pgid not in self.kill_at:
            return  # freed or killed already: its number may be someone else's now
        elif verb == b"extend" and pgid not in self.stopping:
            self.kill_at[pgid] = max(self.kill_at[pgid], now + seconds)
        elif verb == b"stop":
            self.stop(pgid, now + seconds)
        elif verb == b"free":
            _signal(pgid, signal.SIGKILL)
            self.forget(pgid)

    def stop(self, pgid: int, kill_at: float) -> None:
        if pgid not in self.stopping:
            self.stopping.add(pgid)
            _signal(pgid, signal.SIGTERM)
        self.kill_at[pgid] = min(self.kill_at[pgid], kill_at)

    def forget(self, pgid: int) -> None:
        del self.kill_at[pgid]
        self.stopping.discard(pgid)

    def kill_due(self, now: float) -> None:
        for pgid in [pgid for pgid, at in self.kill_at.items() if at <= now]:
            _signal(pgid, signal.SIGKILL)
            self.forget(pgid)

    def wait(self, now: float) -> float | None:
        """Seconds until the next kill is due (None: none is, or none has a deadline)."""
        due = min(self.kill_at.values(), default=math.inf)
        return max(0.0, due - now) if due < math.inf else None

    def orphaned(self, now: float) -> None:
        """The node is gone: every group is told to end, and killed ORPHAN_GRACE later (or at its deadline)."""
        for pgid in list(self.kill_at):
            self.stop(pgid, now + ORPHAN_GRACE)


def main() -> None:
    """The warden's loop: read the node's lines, kill the groups whose time is up; on EOF, end them all."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its session is its own: only a stray kill would send it one
    groups, pending = Groups(), b""
    while True:
        readable, _, _ = select.select([0], [], [], groups.wait(time.monotonic()))
        if readable:
            data = os.read(0, 65536)
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            now = time.monotonic()
            for line in lines:
                groups.heard(line, now)
        groups.kill_due(time.monotonic())
    groups.orphaned(time.monotonic())
    while (wait := groups.wait(time.monotonic())) is not None:  # each orphan's kill is due within ORPHAN_GRACE
        time.sleep(wait)
        groups.kill_due(time.monotonic())


# -- the node's side ------------------------------------------------------------------------------------------------


class Leash:
    """The warden's hold on one command's process group; its methods may be called from any thread."""

    __slots__ = ("warden", "pgid")

    def __init__(self, warden: "Warden", pgid: int) -> None:
        self.warden, self.pgid = warden, pgid

    def extend(self, until: float) -> None:
        """Its lease was renewed: its work may live until `until` (time.monotonic())."""
        self.warden.tell("extend", self.pgid, until)

    def stop(self, grace: float) -> None:
        """SIGTERM the group now, SIGKILL it `grace` seconds later: done by the warden, so it happens even if the
        node's loop is blocked or the task that asked is cancelled."""
        self.warden.tell("stop", self.pgid, time.monotonic() + grace)

    def free(self) -> None:
        """The command ended: what is left of its group is killed, and the warden forgets it."""
        self.warden.tell("free", self.pgid, time.monotonic())


class Warden:
    """The node's side of its warden: started with the first hold, spoken to by any thread.

    A warden that died or stopped reading (its pipe broken, or full) is noticed at the next line written to it: the
    node logs it (a warning the first time), starts another and holds every group again with what is left of its
    time. If none starts, it kills those groups itself: work it cannot leash must not run on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one writer at a time: a restart swaps the process under the others
        self._process: subprocess.Popen[bytes] | None = None
        # What ends the warden (closes its pipe): close(), or the collection of this object, or the interpreter's exit.
        self._ending: weakref.finalize[[subprocess.Popen[bytes], float], Warden] | None = None
        self._held: dict[int, float] = {}  # pgid -> its deadline (time.monotonic()), to hold it again after a restart
        self._lost = 0  # wardens lost so far

    def hold(self, pgid: int, until: float) -> Leash:
        """Hold a new command's process group `pgid`, whose work must be dead by `until` (time.monotonic()).
        Raises OSError, once the group is killed, if no warden can be started."""
        with self._lock:
            self._held[pgid] = until
            if self._process is None:
                if not self._start():
                    self._kill_held()
                    raise OSError("the command warden could not be started")
            else:
                self._say("hold", pgid, until)
        return Leash(self, pgid)

    def tell(self, verb: str, pgid: int, until: float) -> None:
        """Send `verb` about a held group (see the module docstring): `until` is the new deadline, or the end of a
        stop's grace."""
        with self._lock:
            if pgid not in self._held:
                return  # freed already, or killed with a warden that could not be replaced
            if verb == "free":
                del self._held[pgid]
            elif verb == "extend":
                self._held[pgid] = until
            self._say(verb, pgid, until)

    def close(self) -> None:
        """The node is stopping: the warden's pipe is closed (it ends what it still holds, normally nothing), and
        it is waited for."""
        with self._lock:
            ending, self._ending, self._process = self._ending, None, None
        if ending is not None:
            ending()

    def _say(self, verb: str, pgid: int, until: float) -> None:
        """Under the lock: one line to the warden; one that cannot take it is replaced."""
        if self._process is None or not _line(self._process, verb, pgid, until):
            self._replace()

    def _start(self) -> bool:
        """Under the lock: start a warden and hold every group we hold with it; False if that failed."""
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__)], stdin=subprocess.PIPE, start_new_session=True
            )
        except OSError as error:
            log.error("could not start the command warden: %s", error)
            return False
        assert process.stdin is not None
        os.set_blocking(process.stdin.fileno(), False)  # a frozen warden fills its pipe: noticed, never waited on
        if all(_line(process, "hold", pgid, until) for pgid, until in self._held.items()):
            self._process, self._ending = process, weakref.finalize(self, _end, process, CLOSE_WAIT)
            return True
        _end(process, 0.0)
        return False

    def _replace(self) -> None:
        """Under the lock: the warden is lost. Say so, end it, start another; if none starts, kill what it held."""
        self._lost += 1
        level = logging.WARNING if self._lost == 1 else logging.INFO
        log.log(level, "the command warden was lost; starting another to hold %s commands", len(self._held))
        process, self._process = self._process, None
        if process is not None and self._ending is not None:
            self._ending.detach()
            _end(process, 0.0)
        if not self._start():
            self._kill_held()

    def _kill_held(self) -> None:
        log.error("no command warden: killing %s commands it would hold", len(self._held))
        for pgid in self._held:
            _signal(pgid, signal.SIGKILL)
        self._held.clear()


def _line(process: "subprocess.Popen[bytes]", verb: str, pgid: int, until: float) -> bool:
    """Write one line to a warden (False: it died, or stopped reading and its pipe is full)."""
    assert process.stdin is not None
    try:
        os.write(process.stdin.fileno(), f"{verb} {pgid} {until - time.monotonic():.3f}\n".encode())
    except OSError:
        return False
    return True


def _end(process: "subprocess.Popen[bytes]", wait: float) -> None:
    """Close a warden's pipe and give it `wait` seconds to end by itself (it ends what it holds), then kill it; with
    no wait, kill it first (a lost warden's groups are held by its successor: it must not end them). Reaped."""
    assert process.stdin is not None
    if wait <= 0:
        process.kill()
    try:
        process.stdin.close()
    except OSError:
        pass
    try:
        process.wait(wait or None)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


if __name__ == "__main__":
    main()
