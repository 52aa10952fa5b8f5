"""Python function calls per job in a node: a figure that does not move with the machine's load.

Throughput on a shared 2-core machine moves +-20 % from one drain to the next, so a change that should not
alter what a node does per job (a restructuring, a move of code between modules) is checked here instead:
one in-process node (`--capacity`) drains `--jobs` no-op Python jobs on a throwaway PostgreSQL server while a
profile hook counts every Python function call in each of the node's threads, from the enqueue to the last
job's end. The figures are calls per job, by thread: the turn timer (claims), the runner's loop (starts and
results), the loop's worker threads (result writes), the Python executor's threads (the job itself), the
rest (heartbeat, watchdog, listener). Each run gets a fresh database; the node runs in a process of its own
importing the code measured (this tree, or with --before the tree at a git ref, in the same run, rotated).

    python bench/calls_per_job.py                      # 20,000 jobs, capacity 32, 2 runs
    python bench/calls_per_job.py --quick              # 4,000 jobs, 1 run
    python bench/calls_per_job.py --before REF         # the code at git REF beside this tree's
    python bench/calls_per_job.py --job bench.jobs:noop_batch --capacity 2000   # a batch function's no-op
    python bench/calls_per_job.py --traced             # tracing on: an OTLP endpoint, every job in a trace
    python bench/calls_per_job.py --timed              # the drain's jobs/s and CPU per job, no calls counted

With --traced the node traces (docs/design.md §12): this process serves an OTLP/HTTP endpoint that takes and drops
what it is sent, and every job is enqueued with a traceparent, so each gets its receive, process and settle spans;
the exporter's thread counts in "rest". (Code from before tracing ignores both, and measures as without.)
"""

import argparse
import collections
import json
import os
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from common import ROOT, farm, fresh_database, load_average, postgres, print_table, rotated, run_on, source_tree

GROUPS = (
    ("turns", ("qp-turns",)),
    ("runner loop", ("qp-runner",)),
    ("loop workers", ("asyncio_",)),
    ("job threads", ("qp-python-",)),
)


def group_of(thread: str) -> str:
    return next((group for group, prefixes in GROUPS if thread.startswith(prefixes)), "rest")


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Dropped(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes every export and keeps nothing (--traced)."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def timed(url: str, jobs: int, capacity: int, job: str, traced: bool) -> dict[str, float | str]:
    """In the child process (--timed): the drain's wall time and this process's CPU time per job, nothing counted
    (the profile hook would weigh on both)."""
    import queueprocessor

    with farm(url=url, settings={}) as run:
        run.start_in_process(name="timed", capacity=capacity, allow_modules=["bench.jobs"])
        time.sleep(2.0)
        wall, cpu = time.monotonic(), time.process_time()
        run.farm.enqueue_python(job, count=jobs, **({"traceparent": TRACEPARENT} if traced else {}))
        while run.farm._store.jobs.counts().get("succeeded", 0) < jobs:
            time.sleep(0.05)
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    return {"jobs/s": jobs / wall, "cpu us/job": 1e6 * cpu / jobs, "code": queueprocessor.__file__}


def measure(url: str, jobs: int, capacity: int, job: str, traced: bool = False) -> dict[str, float | str]:
    """In the child process: drain `jobs` no-op jobs (`job`) with one node; calls per job by thread group, and the code
    that ran them (`code`: the path of the queueprocessor it imported)."""
    import queueprocessor

    calls: collections.Counter[str] = collections.Counter()
    counting = threading.Event()

    def hook(frame, event, arg):
        if event == "call" and counting.is_set():
            calls[group_of(threading.current_thread().name)] += 1

    with farm(url=url, settings={}) as run:  # the node stopped (no drain), the Farm closed at its end
        threading.setprofile(hook)  # every thread the node starts from here on counts its calls
        run.start_in_process(name="calls", capacity=capacity, allow_modules=["bench.jobs"])
        time.sleep(2.0)  # joined, its first turns taken: the drain alone is counted
        counting.set()
        run.farm.enqueue_python(job, count=jobs, **({"traceparent": TRACEPARENT} if traced else {}))
        while run.farm._store.jobs.counts().get("succeeded", 0) < jobs:
            time.sleep(0.05)
        counting.clear()
    per_job: dict[str, float | str] = {group: calls[group] / jobs for group, _ in GROUPS + (("rest", ()),)}
    return per_job | {"total": sum(calls.values()) / jobs, "code": queueprocessor.__file__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4,000 jobs, 1 run")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--capacity", type=int, default=32)
    parser.add_argument(
        "--job", default="bench.jobs:noop", help="the job drained (bench/jobs.py: noop_async, noop_batch)"
    )
    parser.add_argument("--runs", type=int, help="drains per tree (default 2; 1 with --quick)")
    parser.add_argument("--before", metavar="REF", help="also measure the code at this git ref")
    parser.add_argument("--traced", action="store_true", help="tracing on, every job in a trace")
    parser.add_argument("--timed", action="store_true", help="time the drain instead of counting calls")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.jobs = args.jobs or (4000 if args.quick else 20000)
    args.runs = args.runs or (1 if args.quick else 2)
    if args.child:
        how = timed if args.timed else measure
        print(json.dumps(how(args.child, args.jobs, args.capacity, args.job, args.traced)))
        return
    if args.traced:
        sink = ThreadingHTTPServer(("127.0.0.1", 0), Dropped)
        threading.Thread(target=sink.serve_forever, daemon=True).start()
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{sink.server_address[1]}"  # the children's
    print(
        f"{args.jobs} no-op jobs ({args.job}), one node of capacity {args.capacity}, {args.runs} run(s)"
        f"{', traced' if args.traced else ''}; "
        f"{load_average()}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="qp-before-") as old:
        trees = [("this tree", ROOT)] + ([(args.before, source_tree(args.before, Path(old)))] if args.before else [])
        with postgres() as server:
            results = collections.defaultdict(list)
            for r in range(args.runs):
                for label, root in rotated(trees, r):
                    results[label].append(
                        run_on(
                            root,
                            __file__,
                            *("--child", fresh_database(server, "calls"), "--jobs", str(args.jobs)),
                            *("--capacity", str(args.capacity), "--job", args.job),
                            *(("--traced",) if args.traced and label == "this tree" else ()),
                            *(("--timed",) if args.timed else ()),
                        )
                    )
    columns = ["jobs/s", "cpu us/job"] if args.timed else [group for group, _ in GROUPS] + ["rest", "total"]
    print_table(
        ["code", "run", *(c if args.timed else f"{c} calls/job" for c in columns)],
        [
            [label, str(i + 1), *(f"{figures[c]:.1f}" for c in columns)]
            for label, runs in results.items()
            for i, figures in enumerate(runs)
        ],
    )


if __name__ == "__main__":
    main()
