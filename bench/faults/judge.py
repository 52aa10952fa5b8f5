"""Judging a scenario: the service's record and the farm's history tallied (lost, twice at once, re-runs by cause),
and every node's log searched for errors no user caused."""

import re
import statistics
import time
from collections import Counter
from datetime import datetime

from common import RUNS, NodeProcess, query

from .rig import BATCH_CALL, RECLAIMED, SELF_STOP, Rig, secs

# What no fault may leave in a node's log: these scenarios cause nothing a node should crash or leak an
# exception over, so any such line is an error a user did not cause.
LOG_ERRORS = re.compile(
    r"Traceback|exception was never retrieved|KeyError|Exception in thread|"
    r"Task was destroyed but it is pending| (ERROR|CRITICAL) "
)


FALSE_DEATH = "LEASE EXPIRED WHILE ITS MACHINE LIVED"
URL = re.compile(r"https?://\S+")
UNRECORDED = "finished, but its result was not recorded before its lease expired"


def tally_of(rig: Rig) -> dict:
    """What every scenario reports: from the farm's history and the service's record."""
    jobs = query(rig.url, "SELECT id, state, fence FROM qp_jobs WHERE kind <> 'singleton'")
    work = {job for job, _, _ in jobs}  # a singleton runs again and again by design: see its own figures
    batch = {job for (job,) in query(rig.url, "SELECT id FROM qp_jobs WHERE target = :t", t=BATCH_CALL)}
    runs = [
        run
        for run in query(
            rig.url,
            "SELECT job_id, machine_id, fence, started_at, finished_at, outcome, "
            f"error FROM {RUNS} r ORDER BY job_id, fence",
        )
        if run[0] in work
    ]
    requests = [r for r in rig.target.requests() if r["job"] in work]
    answered = {(r["job"], r["fence"]) for r in requests if r["status"] == 200}
    by_job: dict[int, list[tuple]] = {}
    for run in runs:
        by_job.setdefault(run[0], []).append(run)
    causes = Counter()
    stale_completions = 0
    odd = []
    for job_runs in by_job.values():
        for run in job_runs[:-1]:
            cause = cause_of(rig, run, answered)
            causes[cause] += 1
            stale_completions += run[5] == "succeeded"
            if cause in (FALSE_DEATH, UNRECORDED):
                odd.append(f"job {run[0]} runs {job_runs}; " + " | ".join(log_lines(rig.logs, f"job {run[0]} ")))
    per_job = Counter(r["job"] for r in requests)
    lost = sorted(job for job, state, _ in jobs if state not in ("succeeded", "cancelled"))
    cancelled = sum(state == "cancelled" for _, state, _ in jobs)  # an operator's choice, not a loss
    return {
        "jobs": len(jobs) - cancelled,
        "succeeded": len(jobs) - cancelled - len(lost),
        "cancelled": cancelled,
        "lost": len(lost),
        "lost_ids": lost[:20],
        "batch_jobs": len(batch),
        "batch_reruns": sum(len(by_job.get(job, ())) > 1 for job in batch),  # batch jobs the faults hit
        "overlaps": len(rig.target.concurrent_overlaps()),
        "reruns": sum(causes.values()),
        "causes": dict(causes),
        "false_deaths": causes.get(FALSE_DEATH, 0),
        "stuck_runs": sum(1 for run in runs if run[5] == "running"),
        "stale_completions": stale_completions,
        "service_repeats": sum(n - 1 for n in per_job.values()),
        "password_in_logs": sum(rig.server.password in text for text in rig.logs.values()),
        "log_errors": log_errors(rig.logs),
        "odd": odd[:5],
    }


def log_errors(logs: dict[str, str]) -> list[str]:
    """Every line of a node's log that shows an error no user caused (LOG_ERRORS), named by its node."""
    return [f"{name}: {line}" for name, text in logs.items() for line in text.splitlines() if LOG_ERRORS.search(line)]


def log_lines(logs: dict[str, str], needle: str) -> list[str]:
    """Every line of a node's log that holds `needle`, named by its node."""
    return [f"{name}: {line}" for name, text in logs.items() for line in text.splitlines() if needle in line]


def cause_of(rig: Rig, run: tuple, answered: set) -> str:
    """Why a run that was not a job's last ended: its machine's fate, its own stop, or what its error says."""
    job_id, machine, fence, _started, finished, outcome, error = run
    error = error or ""
    if outcome == "lost" and error.startswith(SELF_STOP):
        return "stopped by its own machine (no lease renewal for lease - margin)"
    if outcome == "lost" and error.startswith(RECLAIMED):
        when, how = rig.downed.get(machine, (None, None))
        if when is not None and when <= (finished or time.time()):
            return f"its machine was {how}"
        if (job_id, fence) in answered:
            return UNRECORDED
        return FALSE_DEATH
    said = " ".join(URL.sub("<url>", error).split())  # one line, the same for every job of a kind
    return f"{outcome}: {said[:70]}"


def outlived(rig: Rig, machine: int, since: float, held: list[dict]) -> list[dict]:
    """For each run (a request to the service) `machine` had under way at `since`, its kill or freeze: how long it
    ran on after `since`, when the job's next run started (from `since`), and how long the two were at work at once
    as the service saw them (the record's own clock, so 0 exactly when they never overlapped)."""
    requests = rig.target.requests()
    rows = []
    for run in held:
        mine = next(r for r in requests if (r["job"], r["fence"], r["machine"]) == (run["job"], run["fence"], machine))
        ended = mine["ended"] or time.time()
        later = [r["started"] for r in requests if r["job"] == run["job"] and r["fence"] > run["fence"]]
        taken = min(later, default=None)
        rows.append(
            {
                "job": run["job"],
                "ran_on": ended - since,
                "taken": None if taken is None else taken - since,
                "together": 0.0 if taken is None else max(0.0, ended - taken),
            }
        )
    return rows


def outlived_text(rows: list[dict], what: str) -> str:
    """One sentence of `outlived`'s rows for the report."""
    if not rows:
        return f"no command was under way at the {what}"
    taken = [r["taken"] for r in rows if r["taken"] is not None]
    together = [r["together"] for r in rows if r["together"] > 0]
    return (
        f"{len(rows)} commands under way at the {what} ran on for up to {secs(max(r['ran_on'] for r in rows))} "
        f"after it; their jobs ran again after median {secs(statistics.median(taken) if taken else None)}; "
        f"{len(together)} were still at work when the next run started (up to {secs(max(together, default=None))} "
        "of two runs at once)"
    )


SUMMED = ("jobs", "succeeded", "cancelled", "lost", "reruns", "false_deaths", "stuck_runs", "stale_completions")
SUMMED += ("service_repeats", "password_in_logs", "batch_jobs", "batch_reruns")


def trial_evidence(rig: Rig, twice: list[tuple[dict, dict]], tally: dict, began: float) -> list[str]:
    """For a trial that failed: the service's rows of each job run twice at once or lost (times from the fault's
    start), what the nodes logged about those jobs, and every error line in their logs."""
    jobs = sorted({a["job"] for a, _ in twice} | set(tally["lost_ids"]))[:3]
    lines = []
    for job in jobs:
        for r in sorted((r for r in rig.target.requests() if r["job"] == job), key=lambda r: r["started"]):
            end = "-" if r["ended"] is None else f"{r['ended'] - began:+.2f}"
            lines.append(
                f"service: job {job} attempt {r['attempt']} fence {r['fence']} machine {r['machine']} "
                f"{r['started'] - began:+.2f} .. {end} s, HTTP {r['status']}"
            )
        lines += log_lines(rig.logs, f"job {job} ")[:12]
    return lines + tally["log_errors"][:12]


def log_times(node: NodeProcess, needle: str) -> list[float]:
    """When the node logged lines containing `needle` (each line's local time)."""
    times = []
    for line in node.output().splitlines():
        stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", line)
        if stamp and needle in line:
            times.append(datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return times
