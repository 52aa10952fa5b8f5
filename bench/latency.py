"""Enqueue-to-start latency on an idle farm, with push (LISTEN/NOTIFY) and with polling alone.

Three node processes on PostgreSQL, period 1 s. One no-op Python job at a
time is enqueued at a random moment of the turn cycle and the time from its
insert to the start of its run is read from the database (created_at and the
run's started_at, both database time). The same farm runs once with push and
once started with --no-push, where work waits for the next turn: on average
half a period, at most one period (plus the turn's own small delay).
Targets: p50 at most 20 ms with push; at most one period without.

    python bench/latency.py            # 60 jobs each way
    python bench/latency.py --quick    # 10 jobs each way
"""

import argparse
import random
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 jobs each way (under a minute)")
    parser.add_argument("--samples", type=int, help="jobs each way (default 60)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    samples = args.samples or (10 if args.quick else 60)
    rng = random.Random(args.seed)
    print(f"latency: {NODES} nodes, period {PERIOD:g} s, {samples} jobs each way; {load_average()}", flush=True)
    with postgres() as server:
        results = {push: measure(server, push, samples, rng) for push in (True, False)}
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
    print_table(["mode", "jobs", "p50 ms", "p90 ms", "p99 ms", "max ms", "target ms", "met"], rows)
    print(f"\n{load_average()}")


if __name__ == "__main__":
    main()
