"""Dependencies: how soon a child starts after its parent ends, and a group's callback after its last member.

Three node processes on PostgreSQL, period 1 s. A chain of N steps (one workflow; HTTP jobs calling a real local
server, or no-op Python steps with --chain-of python) runs on the nodes of --before's tree and of this one, with
push (and with --no-push too, with --polling); each step's hand-over is its run's start minus its parent's run's
end, both in database time (qp_runs). Then groups of M no-op jobs with a callback, by this tree's code and by
--before's (its nodes and its enqueue), R of each: the time to enqueue one with no node running, with three idle
and with three draining another group (target: at most 1 s), and the callback's start minus the last member's end,
split at its release (target: p50 at most 50 ms). Targets of the chain: hand-over p50 at most 20 ms with push, at
most one period by polling. Each side's farm is made, fed and read by its own code.

    python bench/dependencies.py            # a chain of 1,000, a group of 10,000
    python bench/dependencies.py --quick    # a chain of 100, a group of 1,000
    python bench/dependencies.py --no-chain --members 10000    # the group only, beside --before REF's
    python bench/dependencies.py --no-group --steps 200         # the chain of HTTP jobs only, beside main
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

from tests.support.httptarget import HttpTarget

PERIOD = 1.0
NODES = 3
NOOP = "bench.jobs:noop"


SCHEMA = """import sys
from queueprocessor.farm import Farm
with Farm(sys.argv[1]) as farm:
    farm.settings(period=float(sys.argv[2]))
"""
CHAIN = """import sys
from queueprocessor.farm import Farm
url, steps, http = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "http"
with Farm(url) as farm:
    spec = lambda: farm.http_spec("/ok") if http else farm.python_spec("bench.jobs:noop")
    flow = farm.workflow("chain").step("0", spec())
    for n in range(1, steps):
        flow.step(str(n), spec(), after=[str(n - 1)])
    print(flow.enqueue())
"""
ENQUEUE = """import sys, time
from queueprocessor.farm import Farm
url, members, noop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
farm = Farm(url)
specs = [farm.python_spec(noop) for _ in range(members)]
started = time.perf_counter()
group = farm.group(specs, callback=farm.python_spec(noop), name="fan")
print(group, time.perf_counter() - started, farm.group_info(group)["callback"]["id"])
"""


def in_tree(tree: Path, script: str, *args: object) -> str:
    """What `script` printed, run with `args` by the code of `tree` in a process of its own: each side's farm is
    made, fed and read by its own code (a newer tree's Farm would upgrade the schema under the older nodes)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, "-c", script, *map(str, args)]
    return subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=True).stdout


def counted(url: str, sql: str, **params) -> int:
    """The count `sql` returns; -1 while its tables are not there yet."""
    try:
        return int(query(url, sql, **params)[0][0])
    except Exception:
        return -1


@contextmanager
def farm_of(server, push: bool, root: Path = ROOT, http_base: str = "http://127.0.0.1:9/"):
    """NODES nodes of `root`'s code on a fresh database made by that code, past their join delay: its URL."""
    url = fresh_database(server, "deps")
    in_tree(root, SCHEMA, url, PERIOD)
    with farm(
        NODES,
        server=server,
        url=url,
        open=False,
        root=root,
        allow_module="bench.jobs",
        http_base=http_base,
        push=None if push else False,
    ):
        live = "SELECT count(*) FROM qp_machines WHERE state = 'active'"
        wait_for(lambda: counted(url, live) == NODES, 60, "nodes to join")
        time.sleep(3.0)  # past the join delay: all take turns
        yield url


def chain(server, push: bool, steps: int, root: Path = ROOT, http: HttpTarget | None = None) -> list[float]:
    """Each step's hand-over in a chain of `steps` by the nodes of `root`, in seconds: HTTP jobs calling `http`'s
    /ok, or no-op Python steps without it."""
    base = http.base_url if http is not None else "http://127.0.0.1:9/"
    with farm_of(server, push, root, base) as url:
        in_tree(root, CHAIN, url, steps, "http" if http is not None else "python")
        done = "SELECT count(*) FROM qp_jobs WHERE state = 'succeeded'"
        wait_for(lambda: counted(url, done) == steps, 600, "the chain", poll=0.5)
        rows = query(
            url,
            "SELECT c.started_at - p.finished_at FROM qp_deps d"
            f" JOIN {RUNS} c ON c.job_id = d.child_id AND c.outcome = 'succeeded'"
            f" JOIN {RUNS} p ON p.job_id = d.parent_id AND p.outcome = 'succeeded'",
        )
        return [row[0] for row in rows]


def enqueue(tree: Path, url: str, members: int) -> tuple[int, float, int]:
    """A group of `members` and its callback enqueued by the code of `tree`, in a process of its own: its id, the
    seconds farm.group took and its callback's id."""
    group, seconds, callback = in_tree(tree, ENQUEUE, url, members, NOOP).split()
    return int(group), float(seconds), int(callback)


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
    with farm_of(server, push=True, root=tree) as url:
        for _ in range(runs):
            group_id, seconds, callback = enqueue(tree, url, members)
            done = "SELECT count(*) FROM qp_jobs WHERE id = :callback AND state = 'succeeded'"
            wait_for(lambda: counted(url, done, callback=callback) == 1, 900, "callback", poll=0.5)
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
    parser.add_argument("--chain-of", choices=("http", "python"), default="http", help="the chain's jobs (%(default)s)")
    parser.add_argument("--polling", action="store_true", help="the chain by polling only (--no-push) too")
    parser.add_argument("--members", type=int, help="jobs of the group (default 10,000)")
    parser.add_argument("--runs", type=int, default=5, help="groups of each kind (default 5)")
    parser.add_argument("--before", default="409d36d", help="git ref whose figures to show beside (%(default)s)")
    parser.add_argument("--no-chain", action="store_true", help="the group only")
    parser.add_argument("--no-group", action="store_true", help="the chain only")
    args = parser.parse_args()
    steps = args.steps or (100 if args.quick else 1000)
    members = args.members or (1000 if args.quick else 10_000)
    print(f"dependencies: {NODES} nodes, period {PERIOD:g} s; {load_average()}", flush=True)
    with postgres() as server, tempfile.TemporaryDirectory() as tmp:
        trees = (("before", source_tree(args.before, Path(tmp))), ("after", ROOT))
        handovers = {} if args.no_chain else chains(server, trees, steps, args.chain_of, args.polling)
        groups = {} if args.no_group else {side: fan_in(server, tree, members, args.runs) for side, tree in trees}
    if handovers:
        print(f"\nhand-over along a chain of {steps} {args.chain_of} jobs; before = {args.before}:")
        print_table(
            ["hand-over", "steps", "p50 ms", "p99 ms", "max ms", "target ms"],
            [
                [
                    label,
                    len(values),
                    ms(percentile(values, 50)),
                    ms(percentile(values, 99)),
                    ms(max(values)),
                    "p50 <= 20" if "push" in label else f"p50 <= {PERIOD * 1000:g}",
                ]
                for label, values in handovers.items()
            ],
        )
    if groups:
        print_groups(groups, members, args.runs, args.before)
    print(f"\n{load_average()}")


def chains(server, trees, steps: int, kind: str, polling: bool) -> dict[str, list[float]]:
    """The chain's hand-overs by each tree's nodes with push (and this tree's by polling only, with `polling`),
    HTTP jobs calling a real local server when `kind` is http."""
    http = HttpTarget() if kind == "http" else None
    try:
        found = {f"{side}, push": chain(server, True, steps, tree, http) for side, tree in trees}
        if polling:
            found["after, polling only (--no-push)"] = chain(server, False, steps, ROOT, http)
        return found
    finally:
        if http is not None:
            http.stop()


def print_groups(groups: dict[str, dict[str, list[float]]], members: int, runs: int, before: str) -> None:
    print(f"\ngroup of {members:,} and a callback, {runs} runs each, p50 (max); before = {before}:")
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


def _p50_max(values: list[float], unit: str) -> str:
    """`values` (seconds) as 'p50 (max)' in `unit`."""
    if unit == "ms":
        return f"{ms(percentile(values, 50))} ({ms(max(values))}) ms"
    return f"{percentile(values, 50):.2f} ({max(values):.2f}) s"


if __name__ == "__main__":
    main()
