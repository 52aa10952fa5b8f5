"""The work itself: Python jobs that exit or interrupt among HTTP jobs, and bulk cancels and retries racing with
parents and their `after=` children."""

import random
import signal
import subprocess
import time
from collections import Counter

from common import query

from queueprocessor.rules.search import JobFilter

from .judge import tally_of
from .rig import LONG, QUICK, QUITS_ON_IMPORT, UNRULY, Outcome, Rig

QUITTERS = {
    f"{UNRULY}:exits": "SystemExit",
    f"{UNRULY}:exits_async": "SystemExit",
    f"{UNRULY}:interrupts": "KeyboardInterrupt",
    f"{QUITS_ON_IMPORT}:run": "SystemExit",
}


def as_it_should(target: str, state: str, error: str | None) -> bool:
    """Whether a job of sys_exit_jobs ended as it should: a quitter failed naming what it raised, any other
    succeeded."""
    if target in QUITTERS:
        return state == "failed" and QUITTERS[target] in (error or "")
    return state == "succeeded"


def sys_exit_jobs(server, quick: bool) -> Outcome:
    """Python jobs that call sys.exit(3) (sync and async), raise KeyboardInterrupt, or whose module calls sys.exit
    as it is imported, mixed with HTTP jobs on one node: every job must end, the quitters failed with an error
    naming what they raised and the others succeeded; then the node, alive, must still claim and run new work, and
    a drain (SIGTERM) must end. The short form sends each quitter once, the long one five times."""
    timing = QUICK if quick else LONG
    rounds = 1 if quick else 5
    rig = Rig(server, timing)
    stuck, drained, drain_code = [], False, None
    try:
        node = rig.start("quits")
        rig.wait_roster()
        started = time.time()
        for _ in range(rounds):
            for target in QUITTERS:
                rig.farm.enqueue_http("/sleep/0.2", count=2)
                rig.farm.enqueue(rig.farm.python_spec(target, max_attempts=1))
        rig.farm.enqueue_http("/sleep/0.2", count=2)
        for phase in ("the quitters and the HTTP jobs among them", "HTTP jobs enqueued after them"):
            if phase.startswith("HTTP"):
                rig.farm.enqueue_http("/ok", count=2 * rig.capacity)
            try:
                rig.settle(15 + 5 * rounds)
            except TimeoutError as error:  # a finding, judged below, not a crash
                stuck.append(f"{phase}: {str(error).splitlines()[0]}")
                break
        alive = node.alive()
        node.process.send_signal(signal.SIGTERM)
        try:
            drain_code = node.process.wait(15)
            drained = True
        except subprocess.TimeoutExpired:
            node.kill()
        jobs = query(rig.url, "SELECT id, target, state, last_error FROM qp_jobs ORDER BY id")
    finally:
        rig.close()
    tally = tally_of(rig)
    wrong = [
        f"job {job} {target}: {state}, {error!r}"
        for job, target, state, error in jobs
        if not as_it_should(target, state, error)
    ]
    quitters = sum(target in QUITTERS for _, target, _, _ in jobs)
    tally.update(lost=len(wrong), lost_ids=wrong[:20], jobs=len(jobs), succeeded=len(jobs) - len(wrong))
    return Outcome(
        "sys-exit",
        f"{quitters} Python jobs that call sys.exit (sync, async, at import) or raise KeyboardInterrupt among "
        f"{len(jobs) - quitters} HTTP jobs on one node (*jobs run*: jobs that ended as they should, the quitters "
        "failed naming what they raised)",
        tally,
        recovery=(
            f"the node {'stayed alive' if alive else 'died'}; {'every job ended' if not stuck else stuck[0]}; "
            + (f"a drain ended (exit code {drain_code})" if drained else "a drain did not end within 15 s")
        ),
        facts={
            "quitters": quitters,
            "wrong": wrong,
            "stuck": stuck,
            "alive": alive,
            "drained": drained,
            "drain_code": drain_code,
            "elapsed": time.time() - started,
        },
        notes=stuck + wrong[:10],
    )


UNFINISHED = ("waiting", "queued", "running")


def dependency_races(server, quick: bool, seed: int = 13) -> Outcome:
    """Parents that fail once (GET /fails-once/N, one attempt) with children `after=` them and grandchildren after
    those, on three nodes, while bulk cancels (of a random pick of jobs, as the app's selection) and bulk retries
    (`retry --queue default`) are issued at random moments; in the end, failed and cancelled jobs are retried until
    none is left. Judged by the service's record: no child's request before its parent's successful request ended;
    and by the database: nothing waits for ever (every job ends)."""
    timing = QUICK if quick else LONG
    rounds, pairs = (2, 4) if quick else (10, 8)
    rng = random.Random(seed)
    rig = Rig(server, timing)
    actions: Counter = Counter()
    stuck = None
    everyone = JobFilter(queue="default")
    try:
        for i in range(3):
            rig.start(f"deps-{i}")
        rig.wait_roster()
        started = time.time()
        for _ in range(rounds):
            mine = []
            for _ in range(pairs):
                [parent] = rig.farm.enqueue_http(f"/fails-once/{rng.uniform(0.3, 1.5):.2f}", max_attempts=1)
                [child] = rig.farm.enqueue_http("/sleep/0.2", after=[parent])
                mine += [parent, child] + rig.farm.enqueue_http("/sleep/0.1", after=[child])
            for action in rng.sample(["cancel", "retry", "retry"], 3):
                time.sleep(rng.uniform(0.2, 1.5))
                if action == "cancel":
                    rig.farm.cancel_jobs(JobFilter(ids=tuple(rng.sample(mine, len(mine) // 4))))
                else:
                    rig.farm.retry_jobs(everyone)
                actions[action] += 1
        raced = time.time()
        deadline = time.monotonic() + (60 if quick else 180)
        while stuck is None:  # what is left failed or cancelled is retried, as an operator would, until none is
            try:
                rig.settle(max(1.0, deadline - time.monotonic()))
            except TimeoutError as error:  # a finding, judged below, not a crash
                stuck = str(error).splitlines()[0]
                break
            if not rig.farm.retry_jobs(everyone):
                break
            actions["final retry"] += 1
        left = dict(query(rig.url, "SELECT state, count(*) FROM qp_jobs GROUP BY state"))
        stuck = stuck or rig.wait_requests_ended(30)
        edges = query(rig.url, "SELECT parent_id, child_id FROM qp_deps WHERE NOT after_ended")
        time.sleep(timing.heartbeat)  # what a run's end makes a node log
    finally:
        rig.close()
    tally = tally_of(rig)
    early = too_early(rig.target.requests(), edges)
    waiting = sum(left.get(state, 0) for state in UNFINISHED)
    return Outcome(
        "dependency-races",
        f"{rounds * pairs} parents failing once, each with a child and a grandchild `after=` it, on 3 nodes, "
        f"{actions['cancel']} bulk cancels and {actions['retry']} bulk retries racing with them, "
        f"{actions['final retry']} retries of what was left",
        tally,
        recovery=(
            f"{len(early)} children ran before their parent's success; "
            + (f"{waiting} jobs never ended ({left})" if waiting or stuck else "every job ended")
        ),
        facts={
            "edges": len(edges),
            "early": early,
            "left": left,
            "waiting": waiting,
            "stuck": stuck,
            "actions": dict(actions),
            "cancelled_then_ran": tally["cancelled"],
            "elapsed": raced - started,
        },
        notes=([stuck] if stuck else []) + early[:10],
    )


def too_early(requests: list[dict], edges: list[tuple[int, int]]) -> list[str]:
    """Each child's request that the service saw start before its parent's successful request (200) had ended."""
    succeeded: dict[int, float] = {}
    for r in requests:
        if r["status"] == 200 and r["job"] not in succeeded:
            succeeded[r["job"]] = r["ended"]
    early = []
    for parent, child in edges:
        for r in requests:
            if r["job"] == child and not (parent in succeeded and succeeded[parent] <= r["started"]):
                done = succeeded.get(parent)
                when = "never succeeded" if done is None else f"succeeded {done - r['started']:.2f} s later"
                early.append(f"job {child} (fence {r['fence']}) started; its parent, job {parent}, {when}")
    return early
