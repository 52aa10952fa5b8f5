"""Kill another machine's node on this host (Node ▸ Kill a Machine on This Host, and the peers' right-click menu):
a crash on purpose, to watch its running jobs move to the others once its lease ends.

Never the wrong process. `refusal` is the whole rule, a pure function of the machine's row (from the snapshot: no
database call), this app (`Here`) and the process its pid names now (`Process`, read from /proc by `look`); it
says in one line why a machine may not be killed from here, or None. A machine is killable only when it runs on
this host, is not this app's own node, checks in (active, paused or draining), and its pid is a live process that
is a QueueProcessor node (its command line names queueprocessor, or `-m ui` for the app) which started before the
row joined: a pid freed by a dead node and taken by a newer process is refused. The two are compared as ages (how
long ago the process started, on this host's boot clock; how long ago the row joined, in database time), so the
database's clock may be another host's. Without /proc (any system but Linux) nothing can be told apart: refused.

`kill` checks again at the moment it acts (holding a pidfd, so the process it checked is the one it signals) and
sends SIGKILL.
"""

import os
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queueprocessor.rules.states import CHECKING_IN

from .snapshot import Snapshot

PROC = Path("/proc")
# Seconds a process may seem to have started after its row joined and still be that row's node: /proc's ticks, and
# the database time at the last read extrapolated on this host's clock. A node starts its Python, imports and
# connects before it registers, so its process is older than its row by more than this.
SLACK = 1.0
SCRIPTS = ("queueprocessor", "queueprocessor-gui")
NO_PROC = "only on Linux: this system has no /proc to tell a node's process from another one's"


@dataclass(frozen=True)
class Process:
    """A process as /proc shows it."""

    pid: int
    argv: tuple[str, ...]
    age: float  # seconds since it started
    ended: bool  # a zombie: it has exited, its parent has not reaped it yet


@dataclass(frozen=True)
class Here:
    """This app: its host, its own node (None when it only watches) and process, the database's time now, and
    whether this system has /proc."""

    host: str
    own_id: int | None
    own_pid: int
    db_now: float
    procfs: bool = True

    @classmethod
    def of(cls, snap: Snapshot, own_id: int | None) -> "Here":
        """This app now, with the database time extrapolated from `snap` (its earliest: the read's start)."""
        db_now = snap.db_now + (time.monotonic() - snap.mono) - snap.read_ms / 1000
        return cls(socket.gethostname(), own_id, os.getpid(), db_now, PROC.is_dir())


def tip(name: str) -> str:
    """What a kill action does, in its tooltip."""
    return f"SIGKILL the node of {name}, as a crash would: its jobs move to the others once its lease ends (asks first)"


def unsupported() -> str | None:
    """Why no machine can be killed from this app at all (no /proc), or None."""
    return None if PROC.is_dir() else NO_PROC


def is_node(argv: tuple[str, ...]) -> bool:
    """A QueueProcessor node's command line: the `queueprocessor` or `queueprocessor-gui` script (run itself, or
    by its interpreter), `-m queueprocessor.cli` (the demo's nodes), or `-m ui` (the app, which runs its node
    in-process)."""
    if any(os.path.basename(arg) in SCRIPTS for arg in argv[:2]):
        return True
    return any(
        before == "-m" and module.split(".")[0] in ("queueprocessor", "ui") for before, module in zip(argv, argv[1:])
    )


def refusal(machine: Mapping[str, Any], here: Here, process: Process | None) -> str | None:
    """Why `machine` (a row of the snapshot: id, name, host, pid, status, joined_at) may not be killed from here,
    in one line; None when it may. `process`: what its pid is now on this host (look()), None when nothing."""
    name, pid = machine["name"], machine["pid"]
    if machine["id"] == here.own_id:
        return "this is this app's own node: drain it, or quit the app"
    if machine["host"] != here.host:
        return f"{name} runs on {machine['host']}, not on this host ({here.host})"
    if machine["status"] not in CHECKING_IN:
        return f"{name} is {machine['status']}: it no longer checks in"
    if not here.procfs:
        return NO_PROC
    if pid == here.own_pid:
        return f"pid {pid} is this app's own process"
    if process is None or process.ended:
        return f"process {pid} has already ended"
    if not is_node(process.argv):
        return f"process {pid} is not a QueueProcessor node ({' '.join(process.argv)[:60] or 'no command line'})"
    late = (here.db_now - machine["joined_at"]) - process.age
    if late > SLACK:
        return f"process {pid} started {late:.0f} s after {name} joined: another process has its pid now"
    return None


def look(pid: int, proc: Path = PROC) -> Process | None:
    """The process `pid` on this host, from /proc; None when there is none."""
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
        stat = (proc / str(pid) / "stat").read_text()
        uptime = float((proc / "uptime").read_text().split()[0])
    except OSError:  # gone, or hidden from this user (/proc mounted with hidepid)
        return None
    # Field 3 is the state and field 22 the start in clock ticks after boot, counted after the name in
    # parentheses (which may hold spaces or parentheses itself).
    fields = stat.rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    words = tuple(a.decode(errors="replace") for a in argv if a)
    return Process(pid, words, uptime - started, fields[0] in ("Z", "X"))


def kill(machine: Mapping[str, Any], here: Here, proc: Path = PROC) -> tuple[bool, str]:
    """SIGKILL `machine`'s node if refusal() allows it now: (killed, what to say in the status bar). A pidfd is
    held across the check and the signal, so a process that took the pid in between is never the one signalled."""
    name, pid = machine["name"], machine["pid"]
    handle = None
    if here.procfs and machine["host"] == here.host and hasattr(os, "pidfd_open"):
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:
            return False, f"{name} (pid {pid}) had already ended"
        except OSError:  # a kernel before 5.3: the check and os.kill, a moment apart
            handle = None
    try:
        why = refusal(machine, here, look(pid, proc) if here.procfs else None)
        if why:
            return False, f"{name} not killed: {why}"
        if handle is not None:
            signal.pidfd_send_signal(handle, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False, f"{name} (pid {pid}) had already ended"
    except PermissionError:
        return False, f"{name} not killed: pid {pid} belongs to another user"
    finally:
        if handle is not None:
            os.close(handle)
    return True, f"Killed {name} (pid {pid}): its jobs move to the other machines once its lease ends"
