"""One job per call: what a single enqueue costs the caller, the API's most common path, beside another tree's.

Bulk enqueue (bench/enqueue.py) is one statement for many jobs; an application that enqueues as things happen
makes one call a job. Each run enqueues `--jobs` HTTP jobs one call each, with a small JSON payload, into a queue
with no setting (a plain queue, what most jobs wait in) and, with --held, into one with a farm-wide limit (held
back: its job's fairness key and turn are worked out too, docs/design.md §9), on a fresh database of one throwaway
PostgreSQL server, from a Farm opened before; it reports milliseconds per call and Python function calls per call
(counted by a profile hook: a figure that does not move with the machine's load). Each tree runs in a process of
its own importing its code (this tree, or with --before the tree at a git ref), the trees rotated in every round.

    python bench/enqueue_one.py --before REF            # 2,000 calls a run, 3 rounds
    python bench/enqueue_one.py --quick --before REF    # 500 calls, 1 round
"""

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, fresh_database, load_average, postgres, print_table, rotated, run_on, source_tree

PAYLOAD = '{"tenant": "acme", "rows": 21}'
NO_HARNESS = "no node runs: a Farm enqueues alone, on a database of the harness's server (postgres, fresh_database)"


def measure(url: str, jobs: int, queue: str) -> dict[str, float | str]:
    """In the child process: `jobs` single enqueues into `queue` (a limited queue when it is not `default`); ms and
    Python calls per call, and the code measured."""
    import queueprocessor
    from queueprocessor.farm import Farm

    calls = collections.Counter[str]()
    with Farm(url) as farm:
        farm.enqueue_http("/warm", queue=queue)  # the queue known, the statements built and the pool open
        if queue != "default":
            farm.set_queue(queue, limit=1000)
        for _ in range(20):
            farm.enqueue_http("/warm", queue=queue, payload=PAYLOAD)
        sys.setprofile(lambda frame, event, arg: calls.update(("call",)) if event == "call" else None)
        started = time.perf_counter()
        for _ in range(jobs):
            farm.enqueue_http("/x", queue=queue, payload=PAYLOAD)
        seconds = time.perf_counter() - started
        sys.setprofile(None)
    return {"ms": seconds / jobs * 1000, "calls": calls["call"] / jobs, "code": queueprocessor.__file__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 calls, 1 round")
    parser.add_argument("--jobs", type=int, help="calls a run (default 2,000)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3; 1 with --quick)")
    parser.add_argument("--held", action="store_true", help="also into a queue with a farm-wide limit")
    parser.add_argument("--before", metavar="REF", help="also measure the code at this git ref")
    parser.add_argument("--child", nargs=2, metavar=("URL", "QUEUE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.jobs = args.jobs or (500 if args.quick else 2000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.child:
        print(json.dumps(measure(args.child[0], args.jobs, args.child[1])))
        return
    print(f"{args.jobs} single enqueues a run, {args.rounds} round(s); {load_average()}", flush=True)
    queues = ["default", "held"] if args.held else ["default"]
    with tempfile.TemporaryDirectory(prefix="qp-before-") as old:
        trees = [("this tree", ROOT)] + ([(args.before, source_tree(args.before, Path(old)))] if args.before else [])
        results = collections.defaultdict(list)
        with postgres() as server:
            for r in range(args.rounds):
                for label, root in rotated(trees, r):
                    for queue in queues:
                        url = fresh_database(server, "one")
                        figures = run_on(root, __file__, "--child", url, queue, "--jobs", str(args.jobs))
                        results[label, queue].append(figures)
    print_table(
        ["code", "queue", "ms a call, median (min-max)", "Python calls a call"],
        [
            [
                label,
                "plain" if queue == "default" else "limited (held back)",
                f"{statistics.median(f['ms'] for f in runs):.3f} "
                f"({min(f['ms'] for f in runs):.3f}-{max(f['ms'] for f in runs):.3f})",
                f"{statistics.median(f['calls'] for f in runs):.0f}",
            ]
            for (label, queue), runs in results.items()
        ],
    )
    print(load_average())


if __name__ == "__main__":
    main()
