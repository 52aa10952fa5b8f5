"""Breaker: a target that fails for a while, then recovers, in front of a rated queue, with and without a breaker.

Each case gets a fresh database on the same throwaway PostgreSQL server, two node processes, and a real HTTP
target (tests/support/httptarget.py) whose /flaky answers 500 from the start until --outage seconds have passed,
then 200. Jobs arrive at half the queue's rate (--rate), each second's due at that second, over the outage and
the tail after it, each with --attempts attempts (its retries due after the backoff, among the new arrivals).
Printed side by side:

- failed for good: jobs that spent every attempt on the outage (what an operator has to retry by hand);
- requests during the outage: what the failing target had to answer;
- time to full rate: from the recovery to the first --window seconds in which the target served at least 90 % of
  the rate, by the target's own record.

    python bench/breaker.py            # a 60 s outage, a 15 s cool-down, 20/s
    python bench/breaker.py --quick    # a 10 s outage, a 2 s cool-down: the same story, scaled down
"""

import argparse
import threading
import time

from common import farm, postgres, print_table, wait_for

from tests.support.httptarget import HttpTarget

FAST = dict(period=0.2, heartbeat=0.2)


def case(server, target: HttpTarget, args, breaker: bool) -> dict:
    """One run: the outage, its recovery and the drain after it; the figures of the docstring."""
    seconds, arriving = int(args.outage + args.tail), args.rate // 2
    jobs = seconds * arriving
    with farm(server=server, prefix="breaker", settings=FAST, http_base=target.base_url, drop=True) as run:
        run.farm.enqueue_http("/ok", queue="api", delay=3600)  # makes the queue known, to set it first
        flow = dict(breaker=args.breaker, cool_down=args.cool_down) if breaker else {}
        run.farm.set_queue("api", rate=f"{args.rate}/s", **flow)
        target.down.set()
        start = time.time()
        ids = [
            job
            for k in range(seconds)
            for job in run.farm.enqueue_http(
                "/flaky", queue="api", count=arriving, at=start + k, max_attempts=args.attempts
            )
        ]
        for i in range(2):
            run.start(f"node-{i}", period=FAST["period"], heartbeat=FAST["heartbeat"], capacity=8)
        up = threading.Timer(args.outage, target.down.clear)
        up.start()
        try:
            wait_for(lambda: time.time() > start + args.outage, args.outage + 5, "the outage")
            recovered = time.time()
            counts = lambda: run.farm.job_counts()  # noqa: E731
            wait_for(lambda: counts()["succeeded"] + counts()["failed"] >= jobs, 600, "the drain")
        finally:
            up.cancel()
        served = [r for r in target.requests("/flaky") if r["started"] >= start]  # this case's requests alone
        failed = sum(1 for i in ids if run.farm.job(i)["state"] == "failed")
        return dict(
            failed=failed,
            during=sum(1 for r in served if r["started"] < recovered),
            full=_time_to_full_rate([r["started"] for r in served if r["status"] == 200], recovered, args),
            jobs=jobs,
        )


def _time_to_full_rate(successes: list[float], recovered: float, args) -> float | None:
    """Seconds from `recovered` to the first window of --window seconds holding 90 % of the rate's starts."""
    successes = sorted(t for t in successes if t >= recovered)
    need = 0.9 * args.rate * args.window
    for i, begin in enumerate(successes):
        if sum(1 for t in successes[i:] if t < begin + args.window) >= need:
            return begin - recovered
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 10 s outage, a 2 s cool-down")
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the target fails (60)")
    parser.add_argument("--tail", type=float, default=30.0, help="seconds of work after it, at the rate (30)")
    parser.add_argument("--rate", type=int, default=20, help="the queue's rate, starts per second (20)")
    parser.add_argument("--breaker", default="5/10s", help="the breaker (5/10s)")
    parser.add_argument("--cool-down", type=float, default=15.0, help="seconds before each canary (15)")
    parser.add_argument("--attempts", type=int, default=3, help="attempts per job (3)")
    parser.add_argument("--window", type=float, default=2.0, help="seconds judged for the full rate (2)")
    args = parser.parse_args()
    if args.quick:
        args.outage, args.tail, args.cool_down = 10.0, 10.0, 2.0
    with postgres() as server, HttpTarget() as target:
        results = {}
        for label, breaker in (("without", False), ("with breaker", True)):
            results[label] = case(server, target, args, breaker)
    print(
        f"a {args.outage:g} s outage at {args.rate}/s, {results['without']['jobs']} jobs of {args.attempts} "
        f"attempts; breaker {args.breaker}, cool-down {args.cool_down:g} s"
    )
    print_table(
        ["case", "failed for good", "requests during the outage", "time to full rate (s)"],
        [
            [label, r["failed"], r["during"], "never" if r["full"] is None else f"{r['full']:.1f}"]
            for label, r in results.items()
        ],
    )


if __name__ == "__main__":
    main()
