"""Debounce on a real farm (docs/design.md §6): 2 real node processes and a real HTTP target that logs each request,
judged by the target's record. Four enqueuing machines (processes of their own, each with its own Farm) enqueue one
debounced key 1,000 times at once: the target sees one request, with the payload of the last enqueue to commit, a
debounce after it. Enqueues that keep coming past `max_delay` get a run at the first enqueue plus `max_delay`, then
a job of their own."""

import json
import subprocess
import sys
import time

import pytest

from queueprocessor.farm import Farm
from queueprocessor.rules.search import JobFilter
from tests.support.work import ROOT, NodeProcesses, wait_for

pytestmark = pytest.mark.postgres

TIMING = dict(period=0.2, heartbeat=0.2)
# How late a due job's request may reach the target: the farm's next turn (a period), then a claim, a start and the
# request itself, on 2 cores shared with other work.
LATE = TIMING["period"] + 0.8
MACHINES, EACH = 4, 250


@pytest.fixture
def farm(pg_url):
    with Farm(pg_url) as the_farm:
        the_farm.settings(**TIMING)
        yield the_farm


@pytest.fixture
def nodes(farm, pg_url, tmp_path, http_target):
    started = NodeProcesses(pg_url, tmp_path, timing=TIMING)
    for name in ("a", "b"):
        started(name, "--http-base", http_target.base_url)
    yield lambda: wait_for(lambda: len(farm.serving("default")) == 2, timeout=30)
    started.kill_all()


def key_jobs(farm, key: str) -> list[int]:
    """The ids of the jobs the farm shows with unique key `key`, oldest first."""
    return sorted(job["id"] for job in farm.find_jobs(JobFilter(search=f"key:{key}"), limit=1000) if job["key"] == key)


def enqueued_by_machines(url: str, path: str, options: dict, ready) -> list[dict]:
    """MACHINES enqueuing processes (tests/support/enqueuer.py) making EACH calls each, all started at once once
    `ready()` returned: what each reported."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.enqueuer", url, path, str(EACH), json.dumps(options), str(m)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            text=True,
        )
        for m in range(MACHINES)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline() == "ready\n", "an enqueuing machine did not start"
        ready()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        return [json.loads(proc.communicate(timeout=60)[0]) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def succeeded(farm, job_id: int) -> dict:
    return wait_for(lambda: (job := farm.job(job_id))["state"] == "succeeded" and job, timeout=20)


def test_four_machines_enqueue_a_debounced_key_1000_times_and_the_target_sees_one_run(farm, pg_url, http_target, nodes):
    path, debounce = "/ok?key=report", 2.0
    options = {"key": "report", "debounce": debounce, "max_delay": 60.0}
    made = enqueued_by_machines(pg_url, path, options, ready=nodes)
    returned = {job_id for machine in made for job_id in machine["ids"]}
    assert len(returned) == 1, "every enqueue returned the one waiting job"
    [job_id] = returned
    job = succeeded(farm, job_id)
    [seen] = http_target.requests("/ok")
    assert (seen["job"], seen["status"]) == (job_id, 200)
    sent = json.loads(seen["body"])
    last = made[sent["machine"]]
    # The last enqueue to commit is the last call of one machine (each machine's calls are one after the other),
    # one that no other machine's call began after: a call that began after it returned committed after it.
    assert sent["seq"] == last["last"], "the payload of a machine's last enqueue"
    latest_start = max(machine["before"] for machine in made)
    assert last["after"] >= latest_start, "another enqueue began after this one had committed"
    # Due a debounce after the last enqueue, in database time (the target runs on the database's host).
    assert seen["started"] >= latest_start + debounce, "ran before a debounce had passed since the last enqueue"
    assert seen["started"] <= last["after"] + debounce + LATE, "ran long after it was due"
    assert latest_start + debounce <= job["run_at"] <= last["after"] + debounce, "the farm's own record agrees"
    assert [run["started_at"] >= job["run_at"] for run in job["runs"]] == [True]
    assert key_jobs(farm, "report") == [job_id]


def test_enqueues_that_keep_coming_run_at_the_first_plus_max_delay_then_make_a_new_job(farm, http_target, nodes):
    path, debounce, max_delay, every, count = "/ok?key=feed", 1.0, 2.0, 0.2, 17
    nodes()
    made = []  # (id, before, after): the database's clock read around each enqueue
    start = time.monotonic()
    for seq in range(count):  # 3.2 s of enqueues, one every 0.2 s: past max_delay plus LATE, never a debounce apart
        time.sleep(max(0.0, start + seq * every - time.monotonic()))
        before = farm._store.ask_time()
        [job_id] = farm.enqueue_http(
            path, method="POST", payload=json.dumps({"seq": seq}), key="feed", debounce=debounce, max_delay=max_delay
        )
        made.append((job_id, before, farm._store.ask_time()))
    returned = [job_id for job_id, _, _ in made]
    assert len(set(returned)) == 2, f"two jobs, one until max_delay, one after: {sorted(set(returned))}"
    first, second = ids = sorted(set(returned))
    held = returned.count(first)
    assert returned == [first] * held + [second] * (count - held)
    for job_id in ids:
        succeeded(farm, job_id)
    runs = {r["job"]: r for r in http_target.requests("/ok")}
    assert len(http_target.requests("/ok")) == 2 and set(runs) == set(ids), "one request for each job"
    assert key_jobs(farm, "feed") == [second], "the first gave the key up when it started"
    # The first job: due at its first enqueue plus max_delay, which came before its last enqueue plus debounce.
    run = runs[first]
    assert made[0][1] + max_delay <= run["started"] <= made[0][2] + max_delay + LATE
    assert made[0][2] + max_delay < made[held - 1][1] + debounce, "max_delay was reached"
    assert json.loads(run["body"]) == {"seq": held - 1}, "the payload of the last enqueue it took"
    for job_id, before, after in made:
        if after < made[0][1] + max_delay:
            assert job_id == first, "an enqueue before the first job was due went elsewhere"
        if before > run["started"]:
            assert job_id == second, "an enqueue after the first job had started went to it"
    # The second: due a debounce after the last enqueue, or its own first plus max_delay if that came first.
    run = runs[second]
    assert json.loads(run["body"]) == {"seq": count - 1}
    due_after = min(made[-1][1] + debounce, made[held][1] + max_delay)
    assert due_after <= run["started"] <= min(made[-1][2] + debounce, made[held][2] + max_delay) + LATE
