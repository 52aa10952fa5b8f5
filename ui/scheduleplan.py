"""What the Schedules tab says of a schedule's policy and plan: its overlap policy, jitter, pause on failure and
the time a pause ends, as columns of the schedules' table; the next occurrences of the selected one with its
jitter applied (rules.schedules.upcoming_runs, worked out on the worker thread as the snapshot is made: see
`next_runs`); and which of its last occurrences were skipped, and why.

Plain functions of the rows the snapshot holds: nothing here touches the database."""

from queueprocessor.rules.output import format_time
from queueprocessor.rules.schedules import PREVIEW, SKIPPED, upcoming_runs

from . import text
from .models import Column


def _overlap_tip(row: dict, _context) -> str:
    return {
        "allow": "Each occurrence runs, beside the last one's run if that is still going (the default)",
        "skip": "An occurrence due while the last one's run is still going is skipped (cancelled, with why)",
        "buffer-one": "An occurrence due while the last one's run is still going waits for it; one at most waits",
        "cancel-previous": "An occurrence due while the last one's run is still going asks that run to stop, then runs",
    }.get(row["overlap"], row["overlap"])


def jitter_text(row: dict, _context=None) -> str:
    return text.duration(row["jitter"]) if row["jitter"] else "–"


def pause_on_failure_text(row: dict, _context=None) -> str:
    """After how many failed runs in a row the schedule pauses itself, and how many it has had."""
    limit = row["pause_on_failure"]
    if not limit:
        return "–"
    failed = row["failures"]
    return f"after {limit}" + (f" · {failed} failed" if failed else "")


POLICY = [
    Column(
        "Overlap",
        lambda r, c: r["overlap"],
        tip="What an occurrence does while the last one's run still goes",
        cell_tip=_overlap_tip,
    ),
    Column(
        "Jitter",
        jitter_text,
        lambda r, c: r["jitter"] or 0.0,
        True,
        tip="Each occurrence starts up to this late, by a delay fixed per occurrence that every machine agrees on, "
        "so schedules due at the same time do not all start in the same second",
    ),
    Column(
        "Pauses",
        pause_on_failure_text,
        lambda r, c: r["pause_on_failure"] or 0,
        tip="It pauses itself after this many failed runs in a row (each failed for good), and how many it has had",
    ),
]


def next_text(row: dict, now: float) -> str:
    """The next occurrence (local time, and how far off in database time); a pause with an end says when the farm
    resumes it."""
    until = row["paused_until"]
    if row["paused"] and until is not None:
        return f"resumes in {text.duration(max(0.0, until - now))}"
    if row["next_at"] is None:
        return "–"
    return f"{text.clock(row['next_at'], millis=False)} · in {text.duration(max(0.0, row['next_at'] - now))}"


def next_runs(schedule: dict | None, now: float) -> list[float]:
    """The selected schedule's next PREVIEW start times with its jitter applied, from `now` (database time) or from
    the end of its pause; none while it is paused for good. Call it off the GUI thread (croniter's work)."""
    return [] if schedule is None else upcoming_runs(schedule, now, PREVIEW)


def next_tip(row: dict, _context) -> str | None:
    """The next occurrence's time in UTC, or the pause's end."""
    at = row["paused_until"] if row["paused"] else row["next_at"]
    return None if at is None else f"{format_time(at)} UTC"


def says_skipped(error: str | None) -> bool:
    """Whether a cancelled occurrence's reason is its overlap policy's."""
    return (error or "").startswith(SKIPPED)


def skipped(run: dict) -> bool:
    """An occurrence the schedule's overlap policy skipped: its job cancelled without a run, saying why."""
    return run["attempt"] is None and run["outcome"] == "cancelled" and says_skipped(run["error"])


def next_runs_text(schedule: dict, times: list[float], now: float) -> str:
    """The next-runs pane's lines: each start with jitter applied, and how far off it is."""
    if not times:
        return "None: paused until resumed" if schedule["paused"] else "None"
    lines = [f"{text.clock(t, millis=False)} · in {text.duration(max(0.0, t - now))}" for t in times]
    if schedule["jitter"]:
        lines.append(f"(each up to {text.duration(schedule['jitter'])} late by its jitter)")
    return "\n".join(lines)
