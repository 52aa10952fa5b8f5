"""The last runs of the schedule selected in the Schedules tab: when each occurrence was due, how late it started,
where it ran and how it ended, which were an operator's run-now, and which its overlap policy skipped (with why,
in the error column). The rows are the dashboard's
(views.Dashboard.schedule, from ScheduleStore.last_runs); this model only shows them."""

from . import text, theme
from .models import Column, SnapshotModel, dot, full_text
from .scheduleplan import skipped


def late(row: dict, _context) -> str:
    """Start minus due time: signed, so a start claimed ahead of its time shows as early."""
    if row["late"] is None:
        return "–"
    sign = "-" if row["late"] < 0 else "+"
    return f"{sign}{text.duration(abs(row['late']))}"


def kind(row: dict, _context) -> str:
    return "run now" if row["manual"] else "skipped" if skipped(row) else "scheduled"


def _machine(row: dict, _context) -> str:
    return row["machine_name"] or (f"#{row['machine_id']}" if row["machine_id"] is not None else "")


class ScheduleRunsModel(SnapshotModel):
    """One row per run (per attempt), newest occurrence first; an occurrence that never ran as its job's end."""

    key = "run"
    columns = [
        Column("Due", lambda r, c: text.clock(r["due"]), "due", tip="When the occurrence was due (your time zone)"),
        Column(
            "Kind",
            kind,
            tip="scheduled: a regular occurrence; run now: one an operator asked for; skipped: one its overlap "
            "policy skipped, as the last one's run was still going (the error says which)",
        ),
        Column("Job", lambda r, c: str(r["job"]), "job", True),
        Column("Attempt", lambda r, c: str(r["attempt"] or "–"), tip="Which attempt of the occurrence's job"),
        Column("Machine", _machine, tip="The machine that ran it"),
        Column("Started", lambda r, c: text.clock(r["started_at"]), lambda r, c: r["started_at"] or 0),
        Column(
            "Late",
            late,
            lambda r, c: r["late"] if r["late"] is not None else float("inf"),
            True,
            tip="Its start minus the time it was due (a run-now: minus when it was asked for)",
        ),
        Column("Outcome", lambda r, c: r["outcome"], icon=dot(theme.OUTCOME, "outcome")),
        Column("Error", lambda r, c: (r["error"] or "").split("\n")[0][:120], cell_tip=full_text("error")),
    ]


def run_rows(schedule: dict | None) -> list[dict]:
    """The selected schedule's runs as the model keys them (job and attempt)."""
    return [] if schedule is None else [row | {"run": (row["job"], row["attempt"])} for row in schedule["runs"]]
