"""Dependencies: how soon a child starts after its parent ends, and a group's callback after its last member.

Three node processes on PostgreSQL, period 1 s. A chain of N no-op Python steps (one workflow) runs once with
push and once with --no-push; each step's hand-over is its run's start minus its parent's run's end, both in
database time (qp_runs). Then a group of M no-op jobs with a callback: the time to enqueue it, and the callback's
start minus the last member's end. Targets: hand-over p50 at most 20 ms with push, at most one period by polling;
the callback at most 50 ms after the last member.

    python bench/dependencies.py            # a chain of 1,000, a group of 10,000
    python bench/dependencies.py --quick    # a chain of 100, a group of 1,000
"""

import argparse
import time

from common import (
    NodeProcess,
    fresh_database,
    load_average,
    ms,
    percentile,
    print_table,
    query,
    start_postgres,
    stop_all,
    wait_for,
)

from queueprocessor.farm import Farm

PERIOD = 1.0
NODES = 3
NOOP = "bench.jobs:noop"


def farm_of(server, push: bool):
    url = fresh_database(server, "deps")
    farm = Farm(url)
    farm.settings(period=PERIOD)
    extra = ("--allow-module", "bench.jobs") + (() if push else ("--no-push",))
    nodes = [NodeProcess(url, f"node-{i}", extra=extra) for i in range(NODES)]
    wait_for(lambda: len(farm.status()["machines"]) == NODES, 60, "nodes to join")
    time.sleep(3.0)  # past the join delay: all take turns
    return url, farm, nodes


def chain(server, push: bool, steps: int) -> list[float]:
    """Each step's hand-over in a chain of `steps`, in seconds."""
    url, farm, nodes = farm_of(server, push)
    try:
        flow = farm.workflow("chain").step("0", farm.python_spec(NOOP))
        for n in range(1, steps):
            flow.step(str(n), farm.python_spec(NOOP), after=[str(n - 1)])
        flow_id = flow.enqueue()
        wait_for(lambda: farm.workflow_info(flow_id)["progress"]["succeeded"] == steps, 600, "the chain", poll=0.5)
        rows = query(
            url,
            "SELECT c.started_at - p.finished_at FROM qp_deps d"
            " JOIN qp_runs c ON c.job_id = d.child_id AND c.outcome = 'succeeded'"
            " JOIN qp_runs p ON p.job_id = d.parent_id AND p.outcome = 'succeeded'",
        )
        return [row[0] for row in rows]
    finally:
        stop_all(nodes)
        farm.close()


def fan_in(server, members: int) -> tuple[float, float]:
    """(seconds to enqueue a group of `members` and its callback, its callback's start after the last member's end)."""
    url, farm, nodes = farm_of(server, push=True)
    try:
        started = time.perf_counter()
        group_id = farm.group(
            [farm.python_spec(NOOP) for _ in range(members)], callback=farm.python_spec(NOOP), name="fan"
        )
        enqueued = time.perf_counter() - started
        wait_for(lambda: farm.group_info(group_id)["callback"]["state"] == "succeeded", 900, "the callback", poll=0.5)
        callback = farm.group_info(group_id)["callback"]["id"]
        [(gap,)] = query(
            url,
            "SELECT (SELECT started_at FROM qp_runs WHERE job_id = :callback AND outcome = 'succeeded')"
            " - max(r.finished_at) FROM qp_runs r JOIN qp_flow_jobs m ON m.job_id = r.job_id WHERE m.flow_id = :g",
            callback=callback,
            g=group_id,
        )
        return enqueued, gap
    finally:
        stop_all(nodes)
        farm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a chain of 100 and a group of 1,000")
    parser.add_argument("--steps", type=int, help="steps of the chain (default 1,000)")
    parser.add_argument("--members", type=int, help="jobs of the group (default 10,000)")
    args = parser.parse_args()
    steps = args.steps or (100 if args.quick else 1000)
    members = args.members or (1000 if args.quick else 10_000)
    print(f"dependencies: {NODES} nodes, period {PERIOD:g} s; {load_average()}", flush=True)
    server = start_postgres()
    try:
        handovers = {push: chain(server, push, steps) for push in (True, False)}
        enqueued, gap = fan_in(server, members)
    finally:
        server.stop()
    rows = [
        [
            f"chain of {steps}, " + ("push" if push else "polling only (--no-push)"),
            len(values),
            ms(percentile(values, 50)),
            ms(percentile(values, 99)),
            ms(max(values)),
            "p50 <= 20" if push else f"p50 <= {PERIOD * 1000:g}",
        ]
        for push, values in handovers.items()
    ]
    print()
    print_table(["hand-over", "steps", "p50 ms", "p99 ms", "max ms", "target ms"], rows)
    print(f"\ngroup of {members:,}: enqueued in {enqueued:.2f} s; callback started {ms(gap)} ms after the last member")
    print(f"\n{load_average()}")


if __name__ == "__main__":
    main()
