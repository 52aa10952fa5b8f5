"""Enqueue-to-start latency on an idle farm, with push (LISTEN/NOTIFY) and with polling alone.

Three node processes on PostgreSQL, period 1 s. One no-op Python job at a
time is enqueued at a random moment of the turn cycle and the time from its
insert to the start of its run is read from the database (created_at and the
run's started_at, both database time). The same farm runs once with push and
once started with --no-push, where work waits for the next turn: on average
half a period, at most one period (plus the turn's own small delay).
Targets: p50 at most 20 ms with push; at most one period without.

Then, with push, bursts: 8 connections each commit BURST single-job qp_enqueue calls as fast as they can, at a random
moment of the turn cycle, so that most commits skip their notice for one another's (push is coalesced: at most one
notice per 10 ms for the farm); each job's latency is read the same way. A job whose commit skipped its notice is
taken by the claim the slot's holder makes 20 ms after the notice it answered: no job may wait for a turn (max well
under a period).

    python bench/latency.py            # 60 jobs each way, 10 bursts
    python bench/latency.py --quick    # 10 jobs each way, 3 bursts
"""

import argparse
import random
import threading
import time

from common import farm, load_average, ms, percentile, postgres, print_table, wait_for

PERIOD = 1.0
NODES = 3


def measure(server, push: bool, samples: int, rng: random.Random) -> list[float]:
    with farm(
        NODES,
        server=server,
        prefix="latency",
        settings=dict(period=PERIOD),
        allow_module="bench.jobs",
        push=None if push else False,
    ) as run:
        farm_ = run.farm
        run.wait_joined(NODES)
        time.sleep(3.0)  # past the join delay: all take turns
        latencies = []
        for _ in range(samples):
            time.sleep(rng.uniform(0.2, 1.2))  # any phase of the turn cycle
            [job_id] = farm_.enqueue_python("bench.jobs:noop")
            job = wait_for(
                lambda: (j := farm_.job(job_id))["state"] == "succeeded" and j, 10, f"job {job_id}", poll=0.02
            )
            latencies.append(job["runs"][0]["started_at"] - job["created_at"])
        return latencies


BURST = 10  # commits per connection in a burst
WRITERS = 8


def bursts(server, count: int, rng: random.Random) -> list[float]:
    """The enqueue-to-start latency of every job of `count` bursts of WRITERS x BURST single-job commits, with push."""
    import psycopg
    from sqlalchemy.engine import make_url

    with farm(
        NODES,
        server=server,
        prefix="latency",
        settings=dict(period=PERIOD),
        allow_module="bench.jobs",
        capacity=WRITERS * BURST,  # room for a whole burst on any node: its jobs wait for a claim, not for a place
    ) as run:
        run.wait_joined(NODES)
        time.sleep(3.0)
        dsn = make_url(run.url).set(drivername="postgresql").render_as_string(hide_password=False)
        writers = [psycopg.connect(dsn, autocommit=True) for _ in range(WRITERS)]
        try:
            for n in range(1, count + 1):
                time.sleep(rng.uniform(0.2, 1.2))
                threads = [threading.Thread(target=_burst, args=(conn,)) for conn in writers]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                done = "SELECT count(*) FROM qp_jobs WHERE state = 'succeeded'"
                wait_for(lambda: _one(writers[0], done) == WRITERS * BURST * n, 10, "the burst", poll=0.02)
            rows = (
                writers[0]
                .execute("SELECT r.started_at - j.created_at FROM qp_jobs j JOIN qp_runs r ON r.job_id = j.id")
                .fetchall()
            )
            return [row[0] for row in rows]
        finally:
            for conn in writers:
                conn.close()


def _burst(conn) -> None:
    for _ in range(BURST):
        conn.execute("SELECT qp_enqueue('python', 'bench.jobs:noop')")


def _one(conn, sql: str) -> int:
    return conn.execute(sql).fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 jobs each way (under a minute)")
    parser.add_argument("--samples", type=int, help="jobs each way (default 60)")
    parser.add_argument("--bursts", type=int, help=f"bursts of {WRITERS} x {BURST} commits (default 10)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    samples = args.samples or (10 if args.quick else 60)
    count = args.bursts or (3 if args.quick else 10)
    rng = random.Random(args.seed)
    print(f"latency: {NODES} nodes, period {PERIOD:g} s, {samples} jobs each way; {load_average()}", flush=True)
    with postgres() as server:
        results = {push: measure(server, push, samples, rng) for push in (True, False)}
        burst = bursts(server, count, rng)
    print()
    rows = []
    for push, target in ((True, 0.020), (False, PERIOD)):
        values = results[push]
        met = percentile(values, 50) <= target if push else max(values) <= target + 0.05
        rows.append(
            [
                "push (LISTEN/NOTIFY)" if push else "polling only (--no-push)",
                len(values),
                ms(percentile(values, 50)),
                ms(percentile(values, 90)),
                ms(percentile(values, 99)),
                ms(max(values)),
                f"p50 <= {target * 1000:g}" if push else f"max <= {target * 1000:g} (+50)",
                "yes" if met else "NO",
            ]
        )
    rows.append(
        [
            f"push, bursts of {WRITERS} x {BURST} commits",
            len(burst),
            ms(percentile(burst, 50)),
            ms(percentile(burst, 90)),
            ms(percentile(burst, 99)),
            ms(max(burst)),
            f"max < {PERIOD * 1000:g}",
            "yes" if max(burst) < PERIOD else "NO",
        ]
    )
    print_table(["mode", "jobs", "p50 ms", "p90 ms", "p99 ms", "max ms", "target ms", "met"], rows)
    print(f"\n{load_average()}")


if __name__ == "__main__":
    main()
