"""A bulk retry of 100,000 failed jobs on PostgreSQL: how long it takes, and what it costs a farm draining beside it.

On one throwaway server, each round on fresh databases:

- alone: 100,000 failed jobs (of queue `retried`, as a finish leaves them) retried by one `Farm.retry_jobs`
  (batches of 1,000 ids, one short transaction each), timed around the call;
- beside a drain: the same, while one node (`--capacity 256`, serving queue `drain` only, so the retried jobs
  stay queued) drains a backlog of no-op `async def` jobs; the drain's rate (jobs finished per second) over the
  retry's duration;
- drain alone: the same drain with no bulk action, its rate over a window as long as the retry took beside it.

    python bench/bulk.py              # 100,000 failed jobs, 2 rounds
    python bench/bulk.py --quick      # 10,000, one round
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import farm, fresh_database, load_average, postgres, query, wait_for  # noqa: E402

from queueprocessor import JobFilter  # noqa: E402
from queueprocessor.farm import Farm  # noqa: E402

WARM = 2_000  # drain jobs finished before the window opens: the node is claiming at full speed by then


def failed_jobs(url: str, count: int) -> None:
    """`count` jobs of queue `retried` as a final failure leaves them (enqueued in bulk, then marked in SQL: a
    claim and finish of each would only slow the set-up)."""
    with Farm(url) as farm:
        farm.enqueue(farm.python_spec("bench.jobs:noop", queue="retried", max_attempts=1), count=count)
    query(
        url,
        "UPDATE qp_jobs SET state = 'failed', attempts = 1, fence = 1, finished_at = EXTRACT(EPOCH FROM now()), "
        "last_error = 'boom' WHERE queue = 'retried'",
    )
    query(url, "VACUUM ANALYZE qp_jobs")


def retry_all(url: str) -> float:
    with Farm(url) as farm:
        started = time.perf_counter()
        changed = farm.retry_jobs(JobFilter(queue="retried", state="failed"))
        took = time.perf_counter() - started
    assert changed == int(query(url, "SELECT count(*) FROM qp_jobs WHERE queue = 'retried'")[0][0]), changed
    return took


def finished(url: str) -> int:
    return int(query(url, "SELECT count(*) FROM qp_jobs WHERE queue = 'drain' AND state = 'succeeded'")[0][0])


def drain_rate(server, backlog: int, failed: int, window: float | None) -> tuple[float, float | None]:
    """The drain's rate over the retry of `failed` jobs (window None) or over `window` seconds with no bulk
    action; and how long the retry took (None without one)."""
    with farm(server=server, open=False) as run:
        url = run.url
        if failed:
            failed_jobs(url, failed)
        with Farm(url) as jobs:
            jobs.enqueue(jobs.python_spec("bench.jobs:noop_async", queue="drain"), count=backlog)
        run.start("drainer", capacity=256, queues="drain", allow_module="bench.jobs")
        wait_for(lambda: finished(url) >= WARM, 120, "the drain to start")
        start_count, started = finished(url), time.perf_counter()
        took = None
        if window is None:
            took = retry_all(url)
        else:
            time.sleep(window)
        done, ended = finished(url), time.perf_counter()
        if done >= backlog:
            raise SystemExit("the backlog ran out inside the window: raise --backlog")
        return (done - start_count) / (ended - started), took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000, help="failed jobs retried")
    parser.add_argument("--backlog", type=int, default=150_000, help="jobs of the drain beside it")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.backlog, args.rounds = 10_000, 40_000, 1
    print(f"load before: {load_average()}")
    alone, beside, rate_beside, rate_alone = [], [], [], []
    with postgres() as server:
        for _ in range(args.rounds):
            url = fresh_database(server)
            failed_jobs(url, args.jobs)
            alone.append(retry_all(url))
            rate, took = drain_rate(server, args.backlog, args.jobs, None)
            rate_beside.append(rate)
            beside.append(took)
            rate_alone.append(drain_rate(server, args.backlog, 0, took)[0])
    med = statistics.median
    print(f"bulk retry of {args.jobs:,} failed jobs, {args.rounds} round(s), median (range):")
    print(f"  alone:             {med(alone):.2f} s ({min(alone):.2f}-{max(alone):.2f})")
    print(f"  beside a drain:    {med(beside):.2f} s ({min(beside):.2f}-{max(beside):.2f})")
    print(f"drain rate while it runs: {med(rate_beside):,.0f} jobs/s ({min(rate_beside):,.0f}-{max(rate_beside):,.0f})")
    print(f"drain rate without it:    {med(rate_alone):,.0f} jobs/s ({min(rate_alone):,.0f}-{max(rate_alone):,.0f})")
    print(f"  ratio: {med(rate_beside) / med(rate_alone):.2f}")
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
