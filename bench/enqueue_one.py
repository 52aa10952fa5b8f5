"""One job per call: what a single enqueue costs the caller, the API's most common path, beside another tree's.

Bulk enqueue (bench/enqueue.py) is one statement for many jobs; an application that enqueues as things happen
makes one call a job. Each run enqueues `--jobs` HTTP jobs one call each, with a small JSON payload, into a queue
with no setting (a plain queue, what most jobs wait in) and, with --held, into one with a farm-wide limit (held
back: its job's fairness key and turn are worked out too, docs/design.md §9) and, with --keyed, into the plain queue
with a `key=` of its own each (the most common keyed job: its key taken, no conflict) and with the key of a job
still queued (each call refused with AlreadyTaken: the conflict path), on a fresh database of one throwaway
PostgreSQL server, from a Farm opened before; it reports milliseconds per call and Python function calls per call
(counted by a profile hook: a figure that does not move with the machine's load). Each tree runs in a process of
its own importing its code (this tree, or with --before the tree at a git ref), the trees rotated in every round.

    python bench/enqueue_one.py --before REF            # 2,000 calls a run, 3 rounds
    python bench/enqueue_one.py --quick --before REF    # 500 calls, 1 round
    python bench/enqueue_one.py --held --keyed --before REF   # also a limited queue, a key each, a key taken
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
CASES = {
    "default": "plain",
    "held": "limited (held back)",
    "keyed": "plain, a key of its own each",
    "taken": "plain, a key taken (refused)",
}
NO_HARNESS = "no node runs: a Farm enqueues alone, on a database of the harness's server (postgres, fresh_database)"


def measure(url: str, jobs: int, case: str) -> dict[str, float | str]:
    """In the child process: `jobs` single enqueues of `case` (CASES); ms and Python calls per call, and the code
    measured."""
    import queueprocessor
    from queueprocessor.farm import Farm
    from queueprocessor.rules.errors import DuplicateKey

    queue = "held" if case == "held" else "default"
    calls = collections.Counter[str]()

    def enqueue(n: int) -> None:
        key = {"keyed": f"k{n}", "taken": "taken"}.get(case)
        try:
            farm.enqueue_http("/x", queue=queue, payload=PAYLOAD, key=key)
        except DuplicateKey:
            pass

    with Farm(url) as farm:
        farm.enqueue_http("/warm", queue=queue)  # the queue known, the statements built and the pool open
        if queue != "default":
            farm.set_queue(queue, limit=1000)
        for n in range(20):
            enqueue(-1 - n)  # "taken": the first takes the key, the rest are refused
        sys.setprofile(lambda frame, event, arg: calls.update(("call",)) if event == "call" else None)
        started = time.perf_counter()
        for n in range(jobs):
            enqueue(n)
        seconds = time.perf_counter() - started
        sys.setprofile(None)
    return {"ms": seconds / jobs * 1000, "calls": calls["call"] / jobs, "code": queueprocessor.__file__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 calls, 1 round")
    parser.add_argument("--jobs", type=int, help="calls a run (default 2,000)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3; 1 with --quick)")
    parser.add_argument("--held", action="store_true", help="also into a queue with a farm-wide limit")
    parser.add_argument(
        "--keyed", action="store_true", help="also with a key of its own each, and with a key taken (refused)"
    )
    parser.add_argument("--before", metavar="REF", help="also measure the code at this git ref")
    parser.add_argument("--child", nargs=2, metavar=("URL", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.jobs = args.jobs or (500 if args.quick else 2000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.child:
        print(json.dumps(measure(args.child[0], args.jobs, args.child[1])))
        return
    print(f"{args.jobs} single enqueues a run, {args.rounds} round(s); {load_average()}", flush=True)
    cases = ["default"] + ["held"] * args.held + ["keyed", "taken"] * args.keyed
    with tempfile.TemporaryDirectory(prefix="qp-before-") as old:
        trees = [("this tree", ROOT)] + ([(args.before, source_tree(args.before, Path(old)))] if args.before else [])
        results = collections.defaultdict(list)
        with postgres() as server:
            for r in range(args.rounds):
                for label, root in rotated(trees, r):
                    for case in cases:
                        url = fresh_database(server, "one")
                        figures = run_on(root, __file__, "--child", url, case, "--jobs", str(args.jobs))
                        results[label, case].append(figures)
    print_table(
        ["code", "case", "ms a call, median (min-max)", "Python calls a call"],
        [
            [
                label,
                CASES[case],
                f"{statistics.median(f['ms'] for f in runs):.3f} "
                f"({min(f['ms'] for f in runs):.3f}-{max(f['ms'] for f in runs):.3f})",
                f"{statistics.median(f['calls'] for f in runs):.0f}",
            ]
            for (label, case), runs in results.items()
        ],
    )
    print(load_average())


if __name__ == "__main__":
    main()
