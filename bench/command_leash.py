"""Command leash: what the warden costs command jobs, and how soon a dead or frozen node's command dies.

Three figures, in one run, on a throwaway PostgreSQL server with real node processes at the default timing
(heartbeat 1 s, a lease of 3 s):

- throughput: N `["true"]` command jobs drained by one node (--capacity C), this tree (a warden holds each command)
  beside the tree at --before (default f3125ba: no warden, the node's environment inherited), on the same server;
- spawn: one command's start and end in-process, bare asyncio.create_subprocess_exec (the old way: no leash, the
  whole environment) beside CommandExecutor.run (scrubbed environment, held by the warden, freed at its end);
- death: a node running one long command (`sh -c 'sleep 60'`) is SIGKILLed, or SIGSTOPped alone, and the time from
  that signal to the end of the command's process group (polled every millisecond in /proc) is taken, median of
  --trials, beside the lease. The tree at --before is tried once for each: its command outlives the node.

    python bench/command_leash.py                 # 2,000 jobs, 5 trials
    python bench/command_leash.py --quick         # 500 jobs, 2 trials
"""

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import farm, postgres, print_table, source_tree, wait_for

from queueprocessor.executors import JobContext
from queueprocessor.executors.command import CommandExecutor
from queueprocessor.node.config import FarmTiming
from queueprocessor.rules.job import Claimed

LONG = ["sh", "-c", 'echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 60']
OUTLIVED = 8.0  # seconds after which a command that is still alive is reported as outliving its node


def group_alive(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError):
            continue
        if int(group) == pgid and state != "Z":
            return True
    return False


def leashed(server, root: Path, capacity: int = 4):
    """A farm on a fresh database of `server` whose nodes run the code of `root` and may run `true` and `sh`."""
    return farm(server=server, root=root, allow_command=("true", "sh"), capacity=capacity)


def throughput(server, root: Path, jobs: int, capacity: int) -> float:
    """Jobs per second one node of `root` drains a backlog of `jobs` ["true"] commands at."""
    with leashed(server, root, capacity) as run:
        run.start("t")
        farm_ = run.farm
        wait_for(lambda: "t" in farm_.serving("default"), 30, "the node to join")
        started = time.monotonic()
        farm_.enqueue_command(["true"], count=jobs)
        wait_for(lambda: farm_.job_counts()["succeeded"] == jobs, 600, "the backlog to drain", poll=0.02)
        return jobs / (time.monotonic() - started)


def death(server, root: Path, sig: signal.Signals, work: Path) -> float:
    """Seconds from `sig` to a node of `root` to the end of its command's process group (inf: it outlived)."""
    with leashed(server, root) as run:
        farm_ = run.farm
        worker = run.start("d")
        pid_file = work / f"{time.monotonic_ns()}.pid"
        try:
            wait_for(lambda: "d" in farm_.serving("default"), 30, "the node to join")
            farm_.enqueue_command([*LONG, str(pid_file)])
            wait_for(pid_file.exists, 30, "the command to start", poll=0.01)
            pgid = int(pid_file.read_text())
            time.sleep(0.5)  # a renewal or so into its run, as a crash comes at any time
            worker.process.send_signal(sig)
            sent = time.monotonic()
            while group_alive(pgid) and time.monotonic() - sent < OUTLIVED:
                time.sleep(0.001)
            took = time.monotonic() - sent
            try:
                os.killpg(pgid, signal.SIGKILL)  # what outlived its node
            except ProcessLookupError:
                pass
            return took if took < OUTLIVED else float("inf")
        finally:
            worker.process.send_signal(signal.SIGKILL)
            worker.process.send_signal(signal.SIGCONT)
            worker.process.wait()
            worker.log.close()


async def spawns(count: int) -> tuple[float, float]:
    """Milliseconds per ["true"] command: bare asyncio.create_subprocess_exec, and through CommandExecutor."""
    bare = time.perf_counter()
    for _ in range(count):
        process = await asyncio.create_subprocess_exec(
            "true",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(os.environ),
            start_new_session=True,
        )
        assert process.stdin is not None
        process.stdin.close()
        await process.communicate()
    bare = (time.perf_counter() - bare) / count
    executor = CommandExecutor(("true",))
    job = Claimed(1, "command", '["true"]', "", None, 1, 1, None, 1, 0.0)
    await executor.run(job, JobContext(1, 1, 1, 1, deadline=time.monotonic() + 3600))  # the warden starts here
    leashed = time.perf_counter()
    for _ in range(count):
        await executor.run(job, JobContext(1, 1, 1, 1, deadline=time.monotonic() + 3600))
    leashed = (time.perf_counter() - leashed) / count
    await executor.close()
    return bare * 1000, leashed * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--capacity", type=int, default=16)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--before", default="f3125ba", help="the git ref of the tree without the warden")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.trials = 500, 2
    here = Path(__file__).resolve().parent.parent
    with postgres() as server:
        measure(server, args, here)


def measure(server, args: argparse.Namespace, here: Path) -> None:
    lease = FarmTiming().lease
    with tempfile.TemporaryDirectory(prefix="qp-leash-") as scratch:
        (before := Path(scratch) / "before").mkdir()
        source_tree(args.before, before)
        (work := Path(scratch) / "work").mkdir()
        rows = []
        for label, root in (("warden (this tree)", here), (f"no warden ({args.before})", before)):
            rate = throughput(server, root, args.jobs, args.capacity)
            rows.append([label, f"{args.jobs:,}", f"{rate:,.0f}"])
        print(f"\nthroughput: {args.jobs:,} ['true'] command jobs, one node, capacity {args.capacity}")
        print_table(["node", "jobs", "jobs/s"], rows)

        bare, leashed = asyncio.run(spawns(min(args.jobs, 1000)))
        print("\nspawn: one ['true'] command started and waited for, in-process")
        print_table(
            ["way", "ms per command"],
            [["bare create_subprocess_exec", f"{bare:.2f}"], ["CommandExecutor.run (warden)", f"{leashed:.2f}"]],
        )

        rows = []
        for sig in (signal.SIGKILL, signal.SIGSTOP):
            ours = [death(server, here, sig, work) for _ in range(args.trials)]
            old = death(server, before, sig, work)
            rows.append(
                [
                    sig.name,
                    f"{statistics.median(ours):.3f}",
                    f"{min(ours):.3f}-{max(ours):.3f}",
                    f"outlived (> {OUTLIVED:g} s)" if old == float("inf") else f"{old:.3f}",
                    f"{lease:g}",
                ]
            )
        print(f"\ndeath: seconds from the signal to the node until its command's group is gone ({args.trials} trials)")
        print_table(["signal", "median", "range", args.before, "lease"], rows)


if __name__ == "__main__":
    sys.exit(main())
