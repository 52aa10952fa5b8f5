"""Distribution: how evenly four equal machines share the work.

Four node processes of equal capacity on PostgreSQL take (a) a backlog of
short jobs enqueued at once, which they work off together (the turn-holder
flags the backlog and every node with room claims directly), and (b) a
steady trickle of jobs, which the turns (and push) hand out one slot at a
time. Each job sleeps 20 ms, as real work takes a while. The
figure is jobs per machine and the ratio of the busiest machine's count to
the idlest's; the target is at most 1.25.

    python bench/distribution.py            # 4,000 backlog jobs, then 40 jobs/s for 60 s
    python bench/distribution.py --quick    # 800 backlog jobs, then 40 jobs/s for 10 s
"""

import argparse
import time

from common import RUNS, farm, load_average, print_table, query, wait_for

NODES = 4
CAPACITY = 4
NAP = 0.02  # seconds of work per job


def shares(url: str, since_id: int) -> dict[str, int]:
    rows = query(
        url,
        f"SELECT m.name, count(*) FROM {RUNS} r JOIN qp_machines m ON m.id = r.machine_id "
        "WHERE r.job_id > :since AND r.outcome = 'succeeded' GROUP BY m.name",
        since=since_id,
    )
    return dict(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run (under a minute)")
    args = parser.parse_args()
    backlog, trickle_seconds, rate = (800, 10.0, 40.0) if args.quick else (4000, 60.0, 40.0)
    print(
        f"distribution: {NODES} nodes of capacity {CAPACITY}, jobs of {NAP * 1000:g} ms; {load_average()}", flush=True
    )
    results = {}
    with farm(NODES, prefix="distribution", settings={}, capacity=CAPACITY, allow_module="bench.jobs") as run:
        url, farm_ = run.url, run.farm
        run.wait_joined(NODES)
        time.sleep(3.0)
        farm_.enqueue_python("bench.jobs:nap", NAP, count=backlog)
        wait_for(lambda: farm_._store.jobs.counts()["succeeded"] == backlog, 600, "the backlog", poll=0.2)
        results[f"backlog of {backlog} at once"] = shares(url, 0)
        last = backlog
        start = time.monotonic()
        sent = 0
        while (elapsed := time.monotonic() - start) < trickle_seconds:
            due = int(elapsed * rate) - sent
            if due > 0:
                farm_.enqueue_python("bench.jobs:nap", NAP, count=due)
                sent += due
            time.sleep(0.01)
        wait_for(lambda: farm_._store.jobs.counts()["succeeded"] == backlog + sent, 120, "the trickle", poll=0.2)
        results[f"trickle of {rate:g}/s for {trickle_seconds:g} s"] = shares(url, last)
    print()
    rows = []
    for label, counts in results.items():
        per = [counts.get(f"node-{i}", 0) for i in range(NODES)]
        ratio = max(per) / max(1, min(per))
        rows.append([label, sum(per), *per, f"{ratio:.2f}", "yes" if ratio <= 1.25 else "NO"])
    print_table(["workload", "jobs", *(f"node-{i}" for i in range(NODES)), "max / min", "<= 1.25"], rows)
    print(f"\n{load_average()}")


if __name__ == "__main__":
    main()
