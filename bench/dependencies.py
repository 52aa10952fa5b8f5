"""Dependencies: how soon a child starts after its parent ends, and a group's callback after its last member.

Three node processes on PostgreSQL, period 1 s. A chain of N no-op Python steps (one workflow) runs once with
push and once with --no-push; each step's hand-over is its run's start minus its parent's run's end, both in
database time (qp_runs). Then groups of M no-op jobs with a callback, by this tree's code and by --before's (its
nodes and its enqueue), R of each: the time to enqueue one with no node running, with three idle and with three
draining another group (target: at most 1 s), and the callback's start minus the last member's end, split at its
release (target: p50 at most 50 ms). Targets of the chain: hand-over p50 at most
20 ms with push, at most one period by polling.

    python bench/dependencies.py            # a chain of 1,000, a group of 10,000
    python bench/dependencies.py --quick    # a chain of 100, a group of 1,000
    python bench/dependencies.py --no-chain --members 10000    # the group only, beside --before REF's
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from common import (
    ROOT,
    RUNS,
    farm,
    fresh_database,
    load_average,
    ms,
    percentile,
    postgres,
    print_table,
    query,
    source_tree,
    wait_for,
)

PERIOD = 1.0
NODES = 3
NOOP = "bench.jobs:noop"


@contextmanager
def farm_of(server, push: bool, root: Path = ROOT):
    """NODES nodes of `root`'s code on a fresh database, past their join delay: (its URL, a Farm on it)."""
    with farm(
        NODES,
        server=server,
        prefix="deps",
        settings=dict(period=PERIOD),
        root=root,
        allow_module="bench.jobs",
        push=None if push else False,
    ) as run:
        run.wait_joined(NODES)
        time.sleep(3.0)  # past the join delay: all take turns
        yield run.url, run.farm


def chain(server, push: bool, steps: int) -> list[float]:
    """Each step's hand-over in a chain of `steps`, in seconds."""
    with farm_of(server, push) as (url, farm_):
        flow = farm_.workflow("chain").step("0", farm_.python_spec(NOOP))
        for n in range(1, steps):
            flow.step(str(n), farm_.python_spec(NOOP), after=[str(n - 1)])
        flow_id = flow.enqueue()
        wait_for(lambda: farm_.workflow_info(flow_id)["progress"]["succeeded"] == steps, 600, "the chain", poll=0.5)
        rows = query(
            url,
            "SELECT c.started_at - p.finished_at FROM qp_deps d"
            f" JOIN {RUNS} c ON c.job_id = d.child_id AND c.outcome = 'succeeded'"
            f" JOIN {RUNS} p ON p.job_id = d.parent_id AND p.outcome = 'succeeded'",
        )
        return [row[0] for row in rows]


ENQUEUE = """import sys, time
from queueprocessor.farm import Farm
url, members, noop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
farm = Farm(url)
specs = [farm.python_spec(noop) for _ in range(members)]
started = time.perf_counter()
group = farm.group(specs, callback=farm.python_spec(noop), name="fan")
print(group, time.perf_counter() - started)
"""


def enqueue(tree: Path, url: str, members: int) -> tuple[int, float]:
    """A group of `members` and its callback enqueued by the code of `tree`, in a process of its own: its id and
    the seconds farm.group took."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, "-c", ENQUEUE, url, str(members), NOOP]
    group, seconds = subprocess.run(
        command, cwd=tree, env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return int(group), float(seconds)


def fan_in(server, tree: Path, members: int, runs: int) -> dict[str, list[float]]:
    """The group figures of the code of `tree` (its nodes and its enqueue), `runs` of each, in seconds: enqueue
    with no node running (`idle`); then on a farm of 3 nodes, enqueue (`enqueue`), the callback's release after
    the last member's end (`release`) and its start after that release (`claim`), both in database time (a job
    released is due at its release: run_at), one group at a time; and enqueue while the nodes drain another
    group (`draining`)."""
    found: dict[str, list[float]] = {"idle": []}
    idle = fresh_database(server, "deps")
    for _ in range(runs):
        found["idle"].append(enqueue(tree, idle, members)[1])
    with farm_of(server, push=True, root=tree) as (url, farm_):
        for _ in range(runs):
            group_id, seconds = enqueue(tree, url, members)
            wait_for(lambda: farm_.group_info(group_id)["callback"]["state"] == "succeeded", 900, "callback", poll=0.5)
            callback = farm_.group_info(group_id)["callback"]["id"]
            [(released, claimed)] = query(
                url,
                f"SELECT j.run_at - (SELECT max(r.finished_at) FROM {RUNS} r JOIN qp_flow_jobs m"
                " ON m.job_id = r.job_id WHERE m.flow_id = :g), r.started_at - j.run_at"
                f" FROM qp_jobs j JOIN {RUNS} r ON r.job_id = j.id AND r.outcome = 'succeeded' WHERE j.id = :callback",
                callback=callback,
                g=group_id,
            )
            for name, value in (("enqueue", seconds), ("release", released), ("claim", claimed)):
                found.setdefault(name, []).append(value)
        enqueue(tree, url, members)  # work for the nodes while the next ones go in
        found["draining"] = [enqueue(tree, url, members)[1] for _ in range(runs)]
        return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a chain of 100 and a group of 1,000")
    parser.add_argument("--steps", type=int, help="steps of the chain (default 1,000)")
    parser.add_argument("--members", type=int, help="jobs of the group (default 10,000)")
    parser.add_argument("--runs", type=int, default=5, help="groups of each kind (default 5)")
    parser.add_argument("--before", default="9150d1d", help="git ref whose group figures to show beside (%(default)s)")
    parser.add_argument("--no-chain", action="store_true", help="the group only")
    args = parser.parse_args()
    steps = args.steps or (100 if args.quick else 1000)
    members = args.members or (1000 if args.quick else 10_000)
    print(f"dependencies: {NODES} nodes, period {PERIOD:g} s; {load_average()}", flush=True)
    with postgres() as server:
        handovers = {} if args.no_chain else {push: chain(server, push, steps) for push in (True, False)}
        with tempfile.TemporaryDirectory() as tmp:
            groups = {
                side: fan_in(server, tree, members, args.runs)
                for side, tree in (("before", source_tree(args.before, Path(tmp))), ("after", ROOT))
            }
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
    if rows:
        print()
        print_table(["hand-over", "steps", "p50 ms", "p99 ms", "max ms", "target ms"], rows)
    print(f"\ngroup of {members:,} and a callback, {args.runs} runs each, p50 (max); before = {args.before}:")
    for side in groups.values():
        side["callback"] = [release + claim for release, claim in zip(side["release"], side["claim"], strict=True)]
    figures = [
        ("enqueue, no node running", "idle", "s", "<= 1 s"),
        ("enqueue, 3 nodes idle", "enqueue", "s", "<= 1 s"),
        ("enqueue, 3 nodes draining a group", "draining", "s", "<= 1 s"),
        ("callback start after last member", "callback", "ms", "p50 <= 50 ms"),
        ("  of which its release", "release", "ms", ""),
        ("  of which its claim after release", "claim", "ms", ""),
    ]
    print_table(
        ["", "before", "after", "target"],
        [
            [label, *(_p50_max(groups[side][key], unit) for side in ("before", "after")), target]
            for label, key, unit, target in figures
        ],
    )
    print(f"\n{load_average()}")


def _p50_max(values: list[float], unit: str) -> str:
    """`values` (seconds) as 'p50 (max)' in `unit`."""
    if unit == "ms":
        return f"{ms(percentile(values, 50))} ({ms(max(values))}) ms"
    return f"{percentile(values, 50):.2f} ({max(values):.2f}) s"


if __name__ == "__main__":
    main()
