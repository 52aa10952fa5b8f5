"""Schedule accuracy: an every-second schedule on three machines, one of them killed and restarted, then under a
backlog.

Three node processes on PostgreSQL (period 1 s) run a schedule added as a
user adds it (`schedule add tick --every 1 http /ok`, by the CLI) for 5
minutes. A third of the way in, one machine is SIGKILLed; it is started again
10 s later. Two thirds of the way in, 2,000 HTTP jobs of 50 ms are enqueued
at a lower priority than the schedule's (bulk work, `--priority -1`): about
10 s of work for the farm's 12 places, during which each occurrence is due
while every place is taken. Every occurrence is a job keyed `tick@<time>`; its lateness is
when its work began minus its due time. The record is the access log of the
HTTP server the jobs call (when each request arrived, by the wall clock,
which on one host is the database's clock too); with `--work python` it is a
Python job that returns the wall clock at its first line. The start the run
history records (written by the database a moment later, by a statement the
node sends as it starts the job) is shown beside it. The new schedule's first
three occurrences (each a fresh node's first job of its kind) and those of the
10 s after the restart have rows of their own. An occurrence the killed node
had claimed waits for its lease (3 s) by design: it is counted apart ("claims
lost to the kill") and left out of the lateness figures. Targets: p99
lateness at most 20 ms, and exactly one run per occurrence, the kill included.

The baseline comes from the same run's turn log: a farm that only polled
(no claim ahead of time, no start at run_at) would have started each
occurrence at the first turn at or after its time.

    python bench/schedule_accuracy.py            # 5 minutes
    python bench/schedule_accuracy.py --quick    # 40 seconds: kill at 10 s, back at 15 s, backlog at 27 s
    python bench/schedule_accuracy.py --work python   # a Python job's own stamp as the record
"""

import argparse
import bisect
import os
import subprocess
import sys
import time

from common import ROOT, farm, load_average, ms, percentile, postgres, print_table, query, wait_for

from tests.support.httptarget import HttpTarget

PERIOD = 1.0
NODES = 3
# The backlog: more HTTP jobs than the farm's 12 places run in about 10 s, enqueued at a lower priority than the
# schedule's (bulk work below the default 0), so that each occurrence is due while the farm is full.
BACKLOG = 2000
BACKLOG_PATH = "/sleep/0.05"


def run(server, seconds: float, kill_at: float, down: float, work: str, backlog_at: float) -> dict:
    target = HttpTarget()
    try:
        with farm(
            NODES,
            server=server,
            prefix="schedule",
            settings=dict(period=PERIOD),
            http_base=target.base_url,
            allow_module="bench.jobs",
        ) as bench:
            return observed(bench, seconds, kill_at, down, work, backlog_at, target)
    finally:
        target.stop()


def observed(bench, seconds: float, kill_at: float, down: float, work: str, backlog_at: float, target) -> dict:
    """The schedule's run on the farm of `bench`, with its kill and restart and its backlog: what was recorded."""
    url, farm_ = bench.url, bench.farm
    bench.wait_joined(NODES)
    time.sleep(3.0)
    began = farm_._store.ask_time()
    what = ["http", "/ok"] if work == "http" else ["python", "bench.jobs:stamp"]
    subprocess.run(  # as a user adds it
        [sys.executable, "-m", "queueprocessor.cli", "--db", url, "schedule", "add", "tick", "--every", "1", *what],
        check=True,
        stdout=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    time.sleep(max(0.0, began + kill_at - farm_._store.ask_time()))
    victim = bench.nodes[1]
    killed = farm_._store.ask_time()
    bench.kill(victim)
    print(f"  killed node-1 at +{killed - began:.1f} s", flush=True)
    time.sleep(down)
    bench.restart(victim)
    back = farm_._store.ask_time()
    print(f"  started it again at +{back - began:.1f} s", flush=True)
    time.sleep(max(0.0, began + backlog_at - farm_._store.ask_time()))
    flooded = farm_._store.ask_time()  # a backlog of lower priority than the schedule's (see BACKLOG)
    farm_.enqueue_http(BACKLOG_PATH, count=BACKLOG, priority=-1)
    print(f"  {BACKLOG} jobs of {BACKLOG_PATH} at priority -1 enqueued at +{flooded - began:.1f} s", flush=True)
    time.sleep(max(0.0, began + seconds - farm_._store.ask_time()))
    ended = farm_._store.ask_time()
    farm_.pause_schedule("tick")
    wait_for(
        lambda: not query(url, "SELECT count(*) FROM qp_jobs WHERE state = 'running'")[0][0],
        30,
        "the last occurrences to finish",
    )
    jobs = query(url, "SELECT id, run_at FROM qp_jobs WHERE key LIKE :ticks AND state <> 'cancelled'", ticks="tick@%")
    runs = query(url, "SELECT job_id, outcome, started_at, output FROM qp_runs")
    turns = sorted(t for (t,) in query(url, "SELECT taken_at FROM qp_turns"))
    [(drained,)] = query(url, "SELECT max(started_at) FROM qp_jobs WHERE priority = -1")
    arrived: dict[int, float] = {}  # job id -> when its first request reached the server
    for record in target.requests("/ok"):
        if isinstance(record["job"], int):
            arrived.setdefault(record["job"], record["started"])
    return dict(
        began=began,
        ended=ended,
        killed=killed,
        back=back,
        flooded=flooded,
        drained=drained or ended,
        jobs=jobs,
        runs=runs,
        turns=turns,
        arrived=arrived,
    )


def analyse(data: dict, work: str) -> list[dict]:
    """Per occurrence from the schedule's first to 2 s before the end: its lateness, executions and claims; and
    the poll-only baseline."""
    due = sorted((run_at, job_id) for job_id, run_at in data["jobs"] if run_at <= data["ended"] - 2)
    runs: dict[int, list] = {}
    for job_id, outcome, started, output in data["runs"]:
        runs.setdefault(job_id, []).append((outcome, started, output))
    rows = []
    for index, (second, job_id) in enumerate(due):
        mine = runs.get(job_id, [])
        done = [(output, started) for outcome, started, output in mine if outcome == "succeeded"]
        began = (data["arrived"].get(job_id) if work == "http" else float(done[0][0])) if done else None
        turn = data["turns"][bisect.bisect_left(data["turns"], second)] if data["turns"][-1] >= second else None
        rows.append(
            dict(
                second=second,
                executions=len(done),
                claims=len(mine),
                lateness=None if began is None else began - second,
                recorded=(done[0][1] - second) if done else None,
                polled=None if turn is None else turn - second,
                first=index < 3,
                near_kill=data["killed"] - 2 <= second <= data["back"] + 10,
                returned=data["back"] <= second <= data["back"] + 10,
                backlog=data["flooded"] <= second <= data["drained"],
            )
        )
    return rows


def summarise(label: str, rows: list) -> list:
    kept = [r for r in rows if r["claims"] == r["executions"]]  # not held by the killed node (see the docstring)
    late = [r["lateness"] for r in kept if r["lateness"] is not None]
    recorded = [r["recorded"] for r in kept if r["recorded"] is not None]
    counts = [r["executions"] for r in rows]
    return [
        label,
        len(rows),
        ms(percentile(late, 50)),
        ms(percentile(late, 99)),
        ms(max(late)) if late else "-",
        f"{ms(percentile(recorded, 50))} / {ms(percentile(recorded, 99))}",
        counts.count(0),
        counts.count(1),
        sum(1 for c in counts if c > 1),
        sum(r["claims"] - r["executions"] for r in rows),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 seconds (kill at 10 s, back at 15 s, backlog at 27 s)")
    parser.add_argument("--seconds", type=float, help="length of the run (default 300)")
    parser.add_argument("--work", choices=("http", "python"), default="http", help="what the schedule runs")
    args = parser.parse_args()
    seconds = args.seconds or (40.0 if args.quick else 300.0)
    kill_at, down = (10.0, 5.0) if args.quick else (seconds / 3, 10.0)
    backlog_at = kill_at + down + 12.0 if args.quick else 2 * seconds / 3
    print(
        f"schedule accuracy: every 1 s on {NODES} nodes for {seconds:g} s, node-1 killed at +{kill_at:g} s "
        f"and back {down:g} s later, {args.work} jobs; {load_average()}",
        flush=True,
    )
    with postgres() as server:
        data = run(server, seconds, kill_at, down, args.work, backlog_at)
    rows = analyse(data, args.work)
    print()
    print_table(
        [
            "occurrences",
            "count",
            "work began: late p50 ms",
            "p99 ms",
            "max ms",
            "recorded start p50 / p99 ms",
            "0 runs",
            "1 run",
            "2+ runs",
            "claims lost to the kill",
        ],
        [
            summarise("all", rows),
            summarise(
                "away from the kill and the backlog (the first 3 among them)",
                [r for r in rows if not (r["near_kill"] or r["backlog"])],
            ),
            summarise("from 2 s before the kill to 10 s after the restart", [r for r in rows if r["near_kill"]]),
            summarise("the new schedule's first 3 (each a node's first job)", [r for r in rows if r["first"]]),
            summarise("the 10 s after the restart", [r for r in rows if r["returned"]]),
            summarise(f"under a backlog ({BACKLOG} jobs, lower priority)", [r for r in rows if r["backlog"]]),
        ],
    )
    polled = [r["polled"] for r in rows if r["polled"] is not None]
    print(
        f"\nbaseline, poll-only (the first turn at or after each due time, from the same run's turn log): "
        f"lateness p50 {ms(percentile(polled, 50))} ms, p99 {ms(percentile(polled, 99))} ms, "
        f"max {ms(max(polled))} ms"
    )
    late = [r["lateness"] for r in rows if r["lateness"] is not None and r["claims"] == r["executions"]]
    once = all(r["executions"] == 1 for r in rows)
    print(
        f"targets: p99 <= 20 ms: {'yes' if percentile(late, 99) <= 0.020 else 'NO'}; "
        f"exactly one run per occurrence: {'yes' if once else 'NO'}"
    )
    print(f"{load_average()}")


if __name__ == "__main__":
    main()
