"""Failover: how long a killed machine's job waits before it runs again elsewhere.

Three real node processes on PostgreSQL call a real local HTTP service whose
/sleep/30 keeps a job busy. Each trial enqueues one such job, waits until it
runs, lets a random fraction of a heartbeat pass, SIGKILLs the machine that
runs it (no goodbye, no lease hand-back) and measures, in database time, from
the kill to the start of the job's second attempt on another machine. The
target is at most dead timeout + 2 periods (5 s at the defaults).

The time splits in two: the rest of the dead machine's lease (it renewed it
at its last heartbeat), then the wait for the next turn after it ran out.

    python bench/failover.py            # 10 trials
    python bench/failover.py --quick    # 2 trials
"""

import argparse
import random
import time

from common import FarmRun, farm, load_average, percentile, postgres, print_table, query, wait_for

from tests.support.httptarget import HttpTarget

PERIOD = 1.0
HEARTBEAT = 1.0
MISSES = 3
JOIN_DELAY = 1.5 * HEARTBEAT
HANGFIRE_SERVER_TIMEOUT = 300.0  # Hangfire's default BackgroundJobServerOptions.ServerTimeout: 5 minutes


class Bench:
    def __init__(self, run: FarmRun, rng: random.Random):
        self.run = run
        self.url = run.url
        self.rng = rng
        self.farm = run.farm
        self.started = 0
        self.nodes = run.nodes

    def add_node(self) -> None:
        self.started += 1
        self.run.start(f"node-{self.started}")

    def wait_for_roster(self, size: int) -> None:
        """Until `size` live machines have been in the farm long enough to take turns."""

        def ready():
            now = self.farm._store.ask_time()
            rows = query(
                self.url,
                "SELECT joined_at FROM qp_machines WHERE state = 'active' AND last_seen > :t",
                t=now - MISSES * HEARTBEAT,
            )
            return len(rows) >= size and all(now - joined > JOIN_DELAY + HEARTBEAT for (joined,) in rows)

        wait_for(ready, 60, f"{size} machines in the roster")

    def trial(self) -> dict:
        store = self.farm._store
        job_id = self.farm.enqueue_http("/sleep/30", max_attempts=5)[0]
        first = wait_for(lambda: store.runs.read(job_id=job_id), 30, f"job {job_id} to start")[0]
        owner = store.machines.find(str(first["machine_id"]))
        victim = next(n for n in self.nodes if n.pid == owner["pid"] and n.alive())
        time.sleep(self.rng.uniform(0.0, HEARTBEAT))  # any phase of the victim's heartbeat
        lease_until = store.jobs.get(job_id)["lease_until"]
        killed_at = store.ask_time()
        victim.kill()
        second = wait_for(
            lambda: [r for r in store.runs.read(job_id=job_id) if r["attempt"] == 2],
            60,
            f"job {job_id} to be taken over",
        )[0]
        store.jobs.cancel(job_id)
        wait_for(lambda: store.jobs.get(job_id)["state"] == "cancelled", 30, f"job {job_id} to stop")
        self.nodes.remove(victim)
        victim.stop()
        victim.discard_log()
        return {"failover": second["started_at"] - killed_at, "lease_left": lease_until - killed_at}


def trials_on(bench: Bench, trials: int) -> list[dict]:
    """`trials` kills on a farm of 3 nodes, each followed by a new third node."""
    for _ in range(3):
        bench.add_node()
    results = []
    for n in range(trials):
        bench.wait_for_roster(3)
        results.append(bench.trial())
        print(
            f"  trial {n + 1}: job back after {results[-1]['failover']:.3f} s "
            f"(its lease had {results[-1]['lease_left']:.3f} s left)",
            flush=True,
        )
        bench.add_node()  # the farm gets its third machine back
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 trials (under a minute)")
    parser.add_argument("--trials", type=int, help="number of kills (default 10)")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    trials = args.trials or (2 if args.quick else 10)
    target = MISSES * HEARTBEAT + 2 * PERIOD

    print(
        f"failover: 3 nodes, period {PERIOD:g} s, heartbeat {HEARTBEAT:g} s, dead after {MISSES} misses, "
        f"{trials} SIGKILLs; {load_average()}"
    )
    with postgres() as server:
        http = HttpTarget()
        try:
            with farm(
                server=server,
                prefix="failover",
                http_base=http.base_url,
                period=PERIOD,
                heartbeat=HEARTBEAT,
                misses=MISSES,
            ) as run:
                results = trials_on(Bench(run, random.Random(args.seed)), trials)
        finally:
            http.stop()
    failover = [r["failover"] for r in results]
    lease = [r["lease_left"] for r in results]
    turn_wait = [r["failover"] - r["lease_left"] for r in results]
    print()
    print_table(
        [
            "system",
            "trials",
            "kill to restart p50 s",
            "max s",
            "of which lease left p50 s",
            "then turn wait max s",
            "target s",
            "met",
        ],
        [
            [
                "QueueProcessor",
                len(results),
                f"{percentile(failover, 50):.3f}",
                f"{max(failover):.3f}",
                f"{percentile(lease, 50):.3f}",
                f"{max(turn_wait):.3f}",
                f"{target:g}",
                "yes" if max(failover) <= target else "NO",
            ],
            ["Hangfire (default ServerTimeout)", "-", f"{HANGFIRE_SERVER_TIMEOUT:g}", "-", "-", "-", "-", "-"],
        ],
    )
    print(f"\n{load_average()}")


if __name__ == "__main__":
    main()
