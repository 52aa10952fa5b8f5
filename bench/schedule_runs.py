"""What reading a schedule's last runs costs (`schedule show`, Farm.schedule_runs, the app's Last runs panel),
beside the newest-jobs read every dashboard poll makes, on one throwaway PostgreSQL server, in the same run.

A schedule's jobs are found by key and origin among all jobs, newest first, so the cost depends on where they
are: a schedule that runs often has its last runs among the newest jobs (the read stops early), one that ran
before everything else has them behind every other job (the read walks them all). So the database holds, for
each size N: ten ended run-now occurrences of `early` (made first), then N plain jobs, then ten of `often`.
Each read is repeated and its median and p95 are printed beside the baseline's.

    python bench/schedule_runs.py                         # 100,000 and 1,000,000 jobs
    python bench/schedule_runs.py --sizes 10000 --reads 5 # a quick look
"""

import argparse
import statistics
import time

from common import farm, ms, percentile, postgres, print_table, query


def ended_runs_of(farm, name: str, count: int) -> None:
    """`count` occurrences of schedule `name` that ended (run now, then cancelled: no node runs them)."""
    for _ in range(count):
        farm.cancel(farm.run_schedule(name))


def timed(read, reads: int) -> list[float]:
    read()  # the first read plans the statement and warms the cache: not what a repeated read costs
    seconds = []
    for _ in range(reads):
        started = time.perf_counter()
        read()
        seconds.append(time.perf_counter() - started)
    return seconds


def measure(server, size: int, reads: int) -> list[list[str]]:
    with farm(server=server) as run:
        url, farm_ = run.url, run.farm
        spec = farm_.python_spec("bench.jobs:noop_async")
        for name in ("early", "often"):
            farm_.schedule(name, spec, cron="0 3 1 1 *")
        ended_runs_of(farm_, "early", 10)
        farm_.enqueue(spec, count=size)
        ended_runs_of(farm_, "often", 10)
        query(url, "ANALYZE qp_jobs")
        cases = {
            "newest 10 jobs (baseline)": lambda: farm_.list_jobs(limit=10),
            "last 10 runs, recent schedule": lambda: farm_.schedule_runs("often"),
            "last 10 runs, schedule behind all": lambda: farm_.schedule_runs("early"),
        }
        rows = []
        for case, read in cases.items():
            seconds = timed(read, reads)
            rows.append([f"{size:,}", case, ms(statistics.median(seconds)), ms(percentile(seconds, 95))])
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()
    with postgres() as server:
        rows = [row for size in args.sizes for row in measure(server, size, args.reads)]
    print_table(["jobs", "read", "median ms", "p95 ms"], rows)


if __name__ == "__main__":
    main()
