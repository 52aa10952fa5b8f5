"""Metrics cost: a node's throughput while it drains a backlog, with its metrics endpoint scraped every
second and without, side by side in the same drain.

One node process (`queueprocessor node --capacity C --metrics-port 0`) drains a backlog of N no-op Python jobs (the
cheapest job there is, so a per-job cost shows the most) on a throwaway PostgreSQL server. While it drains, this
script alternates windows of W seconds: in a scraped window it GETs /metrics once a second, as Prometheus would (the
node is the farm's reporter, so it also counts the waiting jobs in the database, at most every metrics.WAITING_EVERY
seconds); in a quiet window nobody asks. Each window's throughput is the jobs that succeeded in it (counted in the
database at its edges) over its length. Neighbouring windows share the machine's load of the moment, which on a
shared machine moves far more between runs than any cost measured here; the first window of a drain (start-up) and
the one in which the backlog ran out are left out. Each round is a fresh database and node, and starts with the
other case.

Printed: each window, then per case the sum of jobs over the sum of seconds, the median over the windows of each
one's throughput against the mean of its two neighbours' (scraped / quiet: a steady drift of the load, or of the
drain itself as its table grows, cancels out), and the node's CPU per job in each case. A node with no
--metrics-port does the same work per job (the counts it keeps are always kept, see queueprocessor/node/tally.py);
it only lacks the endpoint.

    python bench/metrics_cost.py              # 150,000 jobs, 2 s windows, 3 rounds
    python bench/metrics_cost.py --quick      # 60,000 jobs, 1 round
"""

import argparse
import re
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_seconds, farm, load_average, postgres, print_table, query, wait_for  # noqa: E402

QUIET, SCRAPED = "quiet", "scraped"
SUCCEEDED = "SELECT count(*) FROM qp_jobs WHERE state = 'succeeded'"


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.read().decode()


def claimed(exposition: str) -> float:
    """The node's claimed-jobs counter in one scrape."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith("queueprocessor_jobs_claimed_total{")
    )


def window(case: str, seconds: float, endpoint: str, url: str, pid: int) -> tuple[int, float, float]:
    """One window: jobs that succeeded in it, its length, and the node's CPU seconds in it."""
    started, done, cpu = time.monotonic(), query(url, SUCCEEDED)[0][0], cpu_seconds(pid)
    deadline = started + seconds
    while (now := time.monotonic()) < deadline:
        if case == SCRAPED:
            scrape(endpoint)
        time.sleep(max(0.0, min(1.0 - (time.monotonic() - now), deadline - time.monotonic())))
    return query(url, SUCCEEDED)[0][0] - done, time.monotonic() - started, cpu_seconds(pid) - cpu


def drain(server, first: str, count: int, capacity: int, seconds: float) -> list[tuple[str, int, float, float]]:
    """One round: a fresh node drains `count` jobs; its full windows (case, jobs, seconds, CPU seconds)."""
    windows = []
    with farm(server=server, prefix="metrics", settings={}, drop=True) as run:  # the database dropped at its end
        url, farm_ = run.url, run.farm
        node = run.start("drainer", capacity=capacity, allow_module="bench.jobs", metrics_port=0)
        endpoint = wait_for(lambda: re.search(r"serving metrics at (\S+)", node.output()), 60, "the endpoint")[1]
        wait_for(lambda: farm_.status()["machines"], 60, "the node to join")
        time.sleep(2.5)  # its join delay: it takes turns from then on
        farm_.enqueue_python("bench.jobs:noop", count=count)
        cases = [first, SCRAPED if first == QUIET else QUIET]
        window(cases[1], seconds, endpoint, url, node.pid)  # start-up: left out
        while True:
            case = cases[len(windows) % 2]
            jobs, elapsed, cpu = window(case, seconds, endpoint, url, node.pid)
            if query(url, SUCCEEDED)[0][0] == count:  # the backlog ran out within this window: left out
                break
            windows.append((case, jobs, elapsed, cpu))
        if claimed(scrape(endpoint)) != count:
            raise RuntimeError("the claimed-jobs counter does not add up to the backlog")
    return windows


def scraped_over_quiet(before, window, after) -> float:
    """A window's throughput against the mean of its neighbours' (the other case), as scraped / quiet: a load
    that drifts steadily through the three cancels out."""
    rate = [w[1] / w[2] for w in (before, window, after)]
    ratio = rate[1] / ((rate[0] + rate[2]) / 2)
    return ratio if window[0] == SCRAPED else 1 / ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="60,000 jobs, 1 round")
    parser.add_argument("--jobs", type=int, help="backlog size (default 150,000; 60,000 with --quick)")
    parser.add_argument("--rounds", type=int, help="drains, each by a fresh node (default 3; 1 with --quick)")
    parser.add_argument("--window", type=float, default=2.0, help="seconds per window")
    parser.add_argument("--capacity", type=int, default=32, help="the node's --capacity")
    args = parser.parse_args()
    count = args.jobs or (60_000 if args.quick else 150_000)
    rounds = args.rounds or (1 if args.quick else 3)
    print(
        f"{count} no-op Python jobs, one node of capacity {args.capacity}, {args.window:g} s windows, {rounds} "
        f"rounds; {load_average()}",
        flush=True,
    )
    windows, ratios = [], []
    with postgres() as server:
        for round_ in range(rounds):
            drained = drain(server, QUIET if round_ % 2 == 0 else SCRAPED, count, args.capacity, args.window)
            windows += drained
            ratios += [scraped_over_quiet(*three) for three in zip(drained, drained[1:], drained[2:])]
            for case, jobs, elapsed, cpu in drained:
                print(
                    f"  round {round_ + 1} {case:8}: {jobs / elapsed:6.0f} jobs/s, node CPU "
                    f"{1e6 * cpu / max(1, jobs):4.0f} us/job",
                    flush=True,
                )
    rate = {
        case: sum(w[1] for w in windows if w[0] == case) / sum(w[2] for w in windows if w[0] == case)
        for case in (QUIET, SCRAPED)
    }
    cpu = {
        case: 1e6 * sum(w[3] for w in windows if w[0] == case) / sum(w[1] for w in windows if w[0] == case)
        for case in (QUIET, SCRAPED)
    }
    print(f"\n{len(windows)} windows ({load_average()})")
    print_table(
        ["", QUIET, "scraped every 1 s", "scraped / quiet"],
        [
            ["jobs/s, all windows", f"{rate[QUIET]:.0f}", f"{rate[SCRAPED]:.0f}", f"{rate[SCRAPED] / rate[QUIET]:.3f}"],
            [
                "jobs/s, each window against its neighbours",
                "",
                "",
                f"{statistics.median(ratios):.3f} (median of {len(ratios)})",
            ],
            ["node CPU us/job", f"{cpu[QUIET]:.0f}", f"{cpu[SCRAPED]:.0f}", f"{cpu[SCRAPED] / cpu[QUIET]:.3f}"],
        ],
    )


if __name__ == "__main__":
    main()
