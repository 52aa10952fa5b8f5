"""In-process nodes on each backend: turns, jobs over real HTTP, operator wishes, timeouts, cancels."""

import time

import pytest
from sqlalchemy import exc

from queueprocessor.executors import JobContext
from queueprocessor.farm import Farm
from queueprocessor.node.runner import JobRunner
from queueprocessor.node.runs import STOPPED, Running
from queueprocessor.rules.clock import SystemClock
from queueprocessor.rules.errors import ConfigError
from queueprocessor.rules.job import Claimed
from queueprocessor.rules.roster import slot_of
from queueprocessor.store.database import unreachable
from queueprocessor.store.types import ClaimRequest
from tests.support.work import FAST, Nodes, wait_for


@pytest.fixture
def nodes(farm, http_target):
    """Start nodes on demand; all are stopped (without draining) at the end."""
    started = []

    def start(name, skew=0.0, capacity=4, **options):
        node = farm.node(
            name=name, capacity=capacity, http_base=http_target.base_url, clock=SystemClock(skew), **FAST, **options
        )
        started.append(node.start())
        return node

    yield start
    for node in started:
        if not node.stopped.is_set():
            node.stop(drain=False)


def test_two_skewed_nodes_take_alternate_turns_and_run_jobs(farm, nodes, http_target):
    a, b = nodes("a", skew=-0.7), nodes("b", skew=0.9)
    ids = farm.enqueue_http("/ok", count=6)
    wait_for(lambda: farm._store.jobs.counts()["succeeded"] == 6)
    start = farm._store.ask_time()
    time.sleep(2.0)
    turns = farm._store.turns.read(start)
    slots = [t["slot"] for t in turns]
    assert len(slots) == len(set(slots))
    assert {t["machine_id"] for t in turns} == {a.id, b.id}
    rotation = sorted([a.id, b.id])
    assert all(t["machine_id"] == rotation[t["slot"] % 2] for t in turns), "each slot belongs to one machine in turn"
    hits = http_target.requests("/ok")
    assert sorted(h["job"] for h in hits) == sorted(ids)
    assert all(h["fence"] == 1 and h["attempt"] == 1 and h["machine"] in (a.id, b.id) for h in hits)
    offsets = {m["name"]: m["clock_offset"] for m in farm.status()["machines"]}
    assert offsets["a"] == pytest.approx(0.7, abs=0.05) and offsets["b"] == pytest.approx(-0.9, abs=0.05)


def test_pause_resume_and_drain_are_obeyed_within_a_heartbeat(farm, nodes):
    a, b = nodes("a"), nodes("b")
    farm.steer("a", "pause")
    wait_for(lambda: a.state == "paused", timeout=1.0)
    time.sleep(0.5)
    since = farm._store.ask_time()
    time.sleep(1.0)
    assert {t["machine_id"] for t in farm._store.turns.read(since)} == {b.id}
    farm.steer(str(a.id), "resume")
    wait_for(lambda: a.state == "active", timeout=1.0)
    farm.steer("b", "drain")
    wait_for(lambda: b.stopped.is_set(), timeout=2.0)
    states = {m["name"]: m["status"] for m in farm.status()["machines"]}
    assert states == {"a": "active", "b": "stopped"}


def test_a_drained_node_finishes_its_running_job_first(farm, nodes, http_target):
    a = nodes("a")
    [job_id] = farm.enqueue_http("/sleep/1")
    wait_for(lambda: farm._store.jobs.get(job_id)["state"] == "running")
    farm.steer("a", "drain")
    wait_for(lambda: a.state == "draining", timeout=1.0)
    wait_for(lambda: a.stopped.is_set(), timeout=5.0)
    assert farm._store.jobs.get(job_id)["state"] == "succeeded"


def test_timeout_stops_the_work_and_retries(farm, nodes, http_target):
    nodes("a")
    [job_id] = farm.enqueue_http("/sleep/5", timeout=0.3, max_attempts=1)
    job = wait_for(lambda: (j := farm._store.jobs.get(job_id))["state"] == "failed" and j)
    assert "timeout of 0.3 s" in job["last_error"]
    [run] = farm._store.runs.read(job_id=job_id)
    assert run["outcome"] == "timeout" and run["finished_at"] - run["started_at"] < 2


def test_cancel_stops_a_running_job_within_a_heartbeat(farm, nodes, http_target):
    nodes("a")
    [job_id] = farm.enqueue_http("/sleep/10")
    wait_for(lambda: farm._store.jobs.get(job_id)["state"] == "running")
    asked = time.monotonic()
    assert farm._store.jobs.cancel(job_id) == "cancelling"
    wait_for(lambda: farm._store.jobs.get(job_id)["state"] == "cancelled", timeout=2.0)
    assert time.monotonic() - asked < 1.0
    assert farm._store.runs.read(job_id=job_id)[0]["outcome"] == "cancelled"


def test_leaving_at_once_hands_running_jobs_back_as_the_operators_exit(farm, nodes, http_target):
    """The operator's second Ctrl-C: the work goes back to the queue, no attempt spent, and the record says why
    (not that the machine lost its lease)."""
    node = nodes("a")
    [job_id] = farm.enqueue_http("/sleep/10")
    wait_for(lambda: farm._store.jobs.get(job_id)["state"] == "running")
    node.stop(drain=False)
    job = farm._store.jobs.get(job_id)
    assert (job["state"], job["attempts"], job["last_error"]) == ("queued", 0, STOPPED["exit"])
    [run] = farm._store.runs.read(job_id=job_id)
    assert run["error"] == STOPPED["exit"] and run["finished_at"] is not None


def test_a_get_sends_a_flat_payload_as_query_parameters_and_refuses_any_other(farm, nodes, http_target):
    nodes("a")
    flat = farm.enqueue_http("/ok", payload='{"day": "2026-11-22", "n": 3, "full": true, "note": "a b&c"}')[0]
    nested = farm.enqueue_http("/ok", payload='{"day": {"from": 1}}', max_attempts=3)[0]
    listed = farm.enqueue_http("/ok", payload="[1, 2]", max_attempts=3)[0]
    posted = farm.enqueue_http("/ok", method="POST", payload='{"day": {"from": 1}}')[0]
    for job_id in (flat, posted):
        wait_for(lambda: farm._store.jobs.get(job_id)["state"] == "succeeded")
    for job_id in (nested, listed):
        job = wait_for(lambda: (j := farm._store.jobs.get(job_id))["state"] == "failed" and j)
        assert "a GET sends its payload as query parameters" in job["last_error"] and "use POST" in job["last_error"]
        assert len(farm._store.runs.read(job_id=job_id)) == 1  # no retry could send it
    hits = {h["job"]: h for h in http_target.requests("/ok")}
    assert hits[flat]["path"] == "/ok?day=2026-11-22&n=3&full=true&note=a+b%26c" and hits[flat]["body"] == ""
    assert hits[posted]["body"] == '{"day":{"from":1}}' and nested not in hits and listed not in hits


def test_a_redirect_is_not_followed_for_it_could_lead_off_the_allow_list(farm, nodes, http_target):
    nodes("a")
    job_id = farm.enqueue_http("/redirect/ok", max_attempts=1)[0]
    job = wait_for(lambda: (j := farm._store.jobs.get(job_id))["state"] == "failed" and j)
    assert "answered HTTP 302" in job["last_error"]
    assert [h["path"] for h in http_target.requests("/")] == ["/redirect/ok"]


def test_finished_jobs_and_old_turns_are_deleted_by_the_turn_holder(farm, nodes, http_target):
    nodes("a", keep_jobs=0.5, turn_keep=1.0, housekeeping=0.2)
    done = farm.enqueue_http("/ok", count=3)
    farm.enqueue_http("/status/500", max_attempts=1)
    waiting = farm.enqueue_http("/ok", delay=60)[0]
    wait_for(lambda: all(farm._store.jobs.get(j)["state"] == "succeeded" for j in done), timeout=5)
    wait_for(lambda: {j["id"] for j in farm._store.jobs.newest()} == {waiting}, timeout=5)
    assert farm._store.runs.read() == [] and farm._store.jobs.get(waiting)["state"] == "queued"
    first = farm._store.turns.read(0)[0]["slot"]
    wait_for(lambda: farm._store.turns.read(0)[0]["slot"] > first, timeout=5)  # by age, not every 600th turn


def test_a_failing_job_fails_alone(farm, nodes, http_target):
    nodes("a")
    bad = farm.enqueue_http("/status/500", max_attempts=1)[0]
    good = farm.enqueue_http("/ok")[0]
    wait_for(lambda: farm._store.jobs.get(bad)["state"] == "failed")
    wait_for(lambda: farm._store.jobs.get(good)["state"] == "succeeded")
    assert "HTTP 500" in farm._store.jobs.get(bad)["last_error"]


def test_a_node_must_agree_with_the_farms_timing(farm):
    farm.settings(period=0.2, heartbeat=0.2)
    with pytest.raises(ConfigError, match="this farm uses period 0.2") as refused:
        farm.node(name="odd", period=0.5)
    assert (refused.value.inputs, refused.value.value) == (("period",), 0.2)  # for a front end's own words


def test_a_backlog_is_shared_by_every_node_with_free_capacity(farm, nodes, http_target):
    a, b = nodes("a", capacity=2), nodes("b", capacity=2)
    farm.enqueue_http("/sleep/0.3", count=12)
    wait_for(lambda: farm._store.jobs.counts()["succeeded"] == 12, timeout=20)
    per_machine = {}
    for hit in http_target.requests("/sleep"):
        per_machine[hit["machine"]] = per_machine.get(hit["machine"], 0) + 1
    assert set(per_machine) == {a.id, b.id}
    assert min(per_machine.values()) >= 4


def test_a_full_farm_still_puts_a_dead_machines_jobs_back_first(farm, nodes, http_target):
    nodes("a", capacity=1), nodes("b", capacity=1)
    busy = farm.enqueue_http("/sleep/3", count=2)
    wait_for(lambda: all(farm._store.jobs.get(j)["state"] == "running" for j in busy))
    ghost = farm._store.machines.register(name="ghost", host="h", instance="ghost", pid=1, version="t", capacity=1)
    [orphan] = farm.enqueue_http("/ok")
    [taken] = farm._store.jobs.claim(ClaimRequest(ghost, 1, lease=0.3))  # and then the ghost machine dies
    assert taken.id == orphan
    newer = farm.enqueue_http("/ok", count=2)
    # Both nodes are full, yet a turn puts the orphan back in the queue...
    wait_for(lambda: farm._store.jobs.get(orphan)["state"] == "queued", timeout=2.5)
    assert all(farm._store.jobs.get(j)["state"] == "running" for j in busy)
    # ...and the first machine to have room runs it before the newer work.
    wait_for(lambda: farm._store.jobs.counts()["succeeded"] == 5, timeout=15)
    starts = {j: farm._store.runs.read(job_id=j)[0]["started_at"] for j in [orphan, *newer]}
    assert starts[orphan] < min(starts[j] for j in newer)


def test_a_machine_judged_dead_is_logged_by_its_name(farm, nodes, caplog):
    caplog.set_level("WARNING", logger="queueprocessor.node")
    nodes("a")
    ghost = farm._store.machines.register(name="ghost-7", host="h", instance="ghost", pid=1, version="t", capacity=1)
    wait_for(lambda: "judged dead" in caplog.text, timeout=15)  # it never checks in
    assert f"machine {ghost} (ghost-7) stopped checking in: judged dead" in caplog.text, caplog.text


def restarts(farm, ghost, job_ids):
    """When each job began to run again after the ghost machine held it, and where."""
    return [
        next((run["started_at"], run["machine_id"]) for run in farm.job(j)["runs"] if run["machine_id"] != ghost)
        for j in job_ids
    ]


def test_a_dead_machines_jobs_beyond_the_turn_holders_room_go_at_once_to_a_machine_with_room(farm, http_target):
    """The first turn after a machine's death may fall to a machine with room for only one of its jobs: the
    others must not wait for the turn of a machine with room."""
    period = 1.0
    start = Nodes(farm, http_target.base_url, period=period)
    ghost = farm._store.machines.register(name="ghost", host="h", instance="ghost", pid=1, version="t", capacity=6)
    orphans = farm.enqueue_http("/sleep/0.5", count=6)
    held = [(job.id, job.fence) for job in farm._store.jobs.claim(ClaimRequest(ghost, 6, lease=60))]
    # ... and then the ghost dies
    try:
        a = start("a", capacity=2)
        [busy] = farm.enqueue_http("/sleep/30")
        wait_for(lambda: farm._store.jobs.get(busy)["owner"] == a.id)  # a has room for one more
        b = start("b", capacity=8)
        time.sleep(1.0)  # both settled, the ghost dead: the turns go to a (even slots) and b
        turn = slot_of(farm._store.ask_time(), period) + 2
        turn += turn % 2
        lease_end = turn * period - 0.1  # just before a's turn, well after b's
        assert len(farm._store.runs.renew(ghost, held, lease_end - farm._store.ask_time())) == 6
        wait_for(lambda: farm._store.jobs.counts()["succeeded"] == 6, timeout=15)
    finally:
        start.stop_all()
    began = restarts(farm, ghost, orphans)
    assert sorted(machine for _, machine in began) == [a.id] + [b.id] * 5
    assert max(t for t, _ in began) < lease_end + period / 2, "the jobs a had no room for waited for b's turn"


@pytest.mark.postgres
def test_a_machine_too_new_to_take_expired_leases_hands_them_to_one_that_may_at_once(pg_url, http_target):
    """A machine takes expired leases only once its own run of check-ins is longer than a lease (it cannot tell
    a stall of the database from a death before), yet it takes turns from its join delay on: a machine
    restarted after a crash does so just as its dead predecessor's leases run out. Such a turn must not leave
    them to the next turn of a settled machine."""
    period = 0.5
    with Farm(pg_url) as farm:
        start = Nodes(farm, http_target.base_url, period=period, heartbeat=1.0, misses=4)  # lease 4 s, join 1.5 s
        ghost = farm._store.machines.register(name="ghost", host="h", instance="ghost", pid=1, version="t", capacity=4)
        orphans = farm.enqueue_http("/ok", count=4)
        held = [(job.id, job.fence) for job in farm._store.jobs.claim(ClaimRequest(ghost, 4, lease=60))]
        # ... and then the ghost dies
        try:
            a = start("a")
            # a judged the ghost dead and buried it: it is in nobody's roster, a newcomer's included
            wait_for(lambda: [m["state"] for m in farm.status()["machines"] if m["id"] == ghost] == ["dead"])
            before = farm._store.ask_time()
            start("n")
            after = farm._store.ask_time()
            # n's turns (odd slots, after a's) from its join delay on, until a lease after its first check-in
            turn = next(
                slot
                for slot in range(slot_of(after + 1.6, period), slot_of(before + 3.7, period))
                if slot % 2 and slot * period >= after + 1.6
            )
            lease_end = turn * period - 0.1  # after a's turn before it
            assert len(farm._store.runs.renew(ghost, held, lease_end - farm._store.ask_time())) == 4
            wait_for(lambda: farm._store.jobs.counts()["succeeded"] == 4, timeout=15)
        finally:
            start.stop_all()
        began = restarts(farm, ghost, orphans)
    assert {machine for _, machine in began} == {a.id}, "n took expired leases before it was settled"
    assert max(t for t, _ in began) < lease_end + period / 2, "the jobs waited for a's next turn"


def test_a_job_writing_its_result_makes_room_but_at_most_capacity_results_wait(farm):
    """Capacity limits the jobs at work: the next claim overlaps the writes of finished ones, up to a bound."""
    runner = JobRunner(farm._store, 1, {}, farm._store.ask_time, lambda _job, _outcome: None)
    try:

        def hold(job_id, writing):
            job = Claimed(job_id, "http", "/ok", "GET", None, 1, 3, None, 1, 0.0)
            runner.running[job.id, job.fence] = entry = Running(job, JobContext(job_id, 1, 1, 1))
            if writing:
                runner._writing_results([entry])

        hold(1, False), hold(2, False)
        assert runner.room(4) == 2
        hold(3, True), hold(4, True)
        assert (runner.room(4), runner.working(), runner.count()) == (2, 2, 4)
        for job_id in range(5, 9):
            hold(job_id, True)
        assert runner.room(4) == 0, "six results waiting to be written: no more claims until some are"
    finally:
        runner.loop.close()


def test_only_a_database_out_of_reach_is_reported_as_unreachable():
    """A statement the database refused, or a fault of ours, is a failed turn, not the database being away."""
    assert unreachable(exc.OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused")))
    assert unreachable(exc.InterfaceError("SELECT 1", {}, Exception("connection already closed")))
    assert unreachable(ConnectionResetError())
    assert not unreachable(exc.IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not unreachable(ZeroDivisionError("float division by zero"))
