"""A schedule's policies (docs/design.md §6): overlap (allow, skip, buffer-one, cancel-previous), deterministic
jitter, backfill of a past range once, pause until a time and pause on failure. On every backend, without nodes:
each test moves the schedule's clock by writing database times (next_run, started_at, paused_until) and runs the
turn-holder's schedule pass (materialise) itself, and claims as a node would (JobStore.claim)."""

import re
import threading
import uuid

import pytest
from sqlalchemy import select, update

from queueprocessor.farm import Farm
from queueprocessor.rules.errors import InvalidJob, NotFound
from queueprocessor.rules.schedules import MAX_BACKFILL, Recurrence, due_of, jitter_of, upcoming_runs
from queueprocessor.store.schema import jobs, schedules
from queueprocessor.store.types import ClaimRequest
from tests.conftest import BACKENDS, PGBOUNCER, backend_url
from tests.support import pyjobs
from tests.support.httptarget import HttpTarget, most_at_once
from tests.support.work import FAST, Nodes, wait_for

STEP = 10.0  # seconds between occurrences: the tests make the past ones by moving next_run back


@pytest.fixture(params=[*BACKENDS, PGBOUNCER])
def db_url(request, tmp_path):
    return backend_url(request, tmp_path)


def pass_(farm: Farm) -> None:
    """The turn-holder's schedule pass."""
    timing = farm._shared.timing()
    farm._store.schedules.materialise(ahead=timing.schedule_ahead, period=timing.period)


def pass_due(farm: Farm, name: str) -> None:
    """The pass at a turn that makes the schedule's next occurrence (one already made: its key lets in no other)."""
    row = farm.get_schedule(name)
    last = Recurrence.of(row).before(farm._store.ask_time())
    farm._store.count(update(schedules).where(schedules.c.name == name).values(next_run=last))
    pass_(farm)


def made(farm: Farm, name: str) -> list[dict]:
    rows = farm._store.rows(select(jobs).where(jobs.c.origin == f"schedule {name}").order_by(jobs.c.id))
    return [dict(r._mapping) for r in rows]


def events(farm: Farm, kind: str) -> list[dict]:
    return [e for e in farm.events(kind=kind)]


def behind(farm: Farm, name: str, *, occurrences: int = 5, **policy) -> list[dict]:
    """A schedule every STEP s whose last `occurrences` fell due in the past (misfire all, within its grace): a pass
    makes each into a job at once. Its jobs, oldest first."""
    farm.settings(**FAST)
    farm.schedule(name, farm.python_spec(pyjobs.noop), every=STEP, misfire="all", **policy)
    now = farm._store.ask_time()
    farm._store.count(update(schedules).where(schedules.c.name == name).values(next_run=now - occurrences * STEP))
    pass_(farm)
    return made(farm, name)


def claim(farm: Farm, limit: int = 20) -> list[int]:
    store = farm._store
    me = store.machines.register(name="m", host="h", instance=uuid.uuid4().hex, pid=1, version="t", capacity=limit)
    return [c.id for c in store.jobs.claim(ClaimRequest(me, limit, 30.0))]


def started_long_ago(farm: Farm, job_id: int) -> None:
    """As if the run had started before every occurrence the test made: each of them fell due while it went on."""
    farm._store.count(update(jobs).where(jobs.c.id == job_id).values(started_at=farm._store.ask_time() - 1000))


def test_allow_is_the_default_and_lets_runs_overlap(farm):
    waiting = behind(farm, "free")
    assert farm.get_schedule("free")["overlap"] == "allow" and all(j["order_key"] is None for j in waiting)
    now = farm._store.ask_time()
    due = {j["id"] for j in waiting if j["run_at"] <= now}
    assert set(claim(farm)) == due and len(due) >= 5  # every due one at once, as before
    pass_(farm)
    assert all(j["state"] == "running" for j in made(farm, "free") if j["id"] in due)
    assert not events(farm, "schedule.skipped")


@pytest.mark.parametrize("overlap", ["skip", "buffer-one", "cancel-previous"])
def test_no_two_runs_of_a_schedule_that_must_not_overlap_are_ever_claimed_at_once(farm, overlap):
    waiting = behind(farm, "one", overlap=overlap)
    assert {j["order_key"] for j in waiting} == {"schedule:one"}
    [first] = claim(farm)
    assert first == waiting[0]["id"]  # the oldest, alone: the order key holds the rest
    assert claim(farm) == []


def test_skip_cancels_each_occurrence_that_fell_due_while_a_run_went_on_with_why(farm):
    waiting = behind(farm, "s", overlap="skip")
    [running] = claim(farm)
    started_long_ago(farm, running)
    pass_(farm)
    jobs_now = {j["id"]: j for j in made(farm, "s")}
    skipped = [j for j in jobs_now.values() if j["state"] == "cancelled"]
    due = [j for j in waiting[1:] if j["run_at"] <= farm._store.ask_time()]
    assert {j["id"] for j in skipped} == {j["id"] for j in due} and len(skipped) >= 4
    reason = f"skipped: overlap=skip, job {running} (the previous run) was still running"
    assert all(j["last_error"] == reason for j in skipped)
    listed = {r["job"]: r for r in farm.schedule_runs("s", limit=50)}
    assert all(listed[j["id"]]["outcome"] == "cancelled" and listed[j["id"]]["error"] == reason for j in skipped)
    [event] = events(farm, "schedule.skipped")
    assert event["subject"] == "s" and reason in event["detail"]
    pass_(farm)
    assert len(events(farm, "schedule.skipped")) == 1  # each is skipped once


def test_an_occurrence_due_before_the_run_started_is_not_skipped(farm):
    """Late ones (the misfire rules') and a backfill's wait their turn: they did not fall due during the run."""
    waiting = behind(farm, "s", overlap="skip")
    [running] = claim(farm)
    farm._store.count(update(jobs).where(jobs.c.id == running).values(started_at=farm._store.ask_time()))
    pass_(farm)
    assert all(j["state"] == "queued" for j in made(farm, "s") if j["id"] != running)
    assert len(waiting) >= 5


def test_buffer_one_keeps_the_first_that_fell_due_and_skips_the_rest(farm):
    waiting = behind(farm, "b", overlap="buffer-one")
    [running] = claim(farm)
    started_long_ago(farm, running)
    pass_(farm)
    now = farm._store.ask_time()
    states = {j["id"]: j for j in made(farm, "b")}
    kept = waiting[1]["id"]
    assert states[kept]["state"] == "queued"
    skipped = [j for j in waiting[2:] if j["run_at"] <= now]
    assert skipped and all(states[j["id"]]["state"] == "cancelled" for j in skipped)
    assert all(f"job {kept} already waits for job {running}" in states[j["id"]]["last_error"] for j in skipped)


def test_cancel_previous_asks_the_run_to_stop_and_keeps_the_newest(farm):
    waiting = behind(farm, "c", overlap="cancel-previous")
    [running] = claim(farm)
    started_long_ago(farm, running)
    pass_(farm)
    now = farm._store.ask_time()
    states = {j["id"]: j for j in made(farm, "c")}
    due = [j for j in waiting[1:] if j["run_at"] <= now]
    assert states[running]["cancel_requested"] and states[running]["state"] == "running"
    assert states[due[-1]["id"]]["state"] == "queued"
    assert all(states[j["id"]]["state"] == "cancelled" for j in due[:-1])
    [stopped] = events(farm, "schedule.stopped")
    assert f"job {running} asked to stop" in stopped["detail"]
    pass_(farm)
    assert len(events(farm, "schedule.stopped")) == 1


def test_a_run_now_is_never_skipped(farm):
    behind(farm, "s", overlap="skip")
    [running] = claim(farm)
    started_long_ago(farm, running)
    asked = farm.run_schedule("s", request="r1")
    assert farm.job(asked)["order_key"] == "schedule:s"  # it does not overlap either
    pass_(farm)
    assert farm.job(asked)["state"] == "queued"


def test_a_failed_run_never_blocks_the_schedule_in_a_queue_that_blocks_its_keys(farm):
    farm.settings(**FAST)
    spec = farm.python_spec(pyjobs.noop, queue="strict")
    farm.schedule("s", spec, every=STEP, misfire="all", overlap="skip")
    now = farm._store.ask_time()
    farm._store.count(update(schedules).values(next_run=now - 3 * STEP))
    pass_(farm)
    farm.set_queue("strict", on_failure="block")
    [first] = claim(farm)
    farm._store.count(update(jobs).where(jobs.c.id == first).values(state="failed", finished_at=now, lease_until=None))
    assert claim(farm) == []  # the block policy holds the key
    pass_(farm)
    assert farm.job(first)["order_key"] is None
    assert len(claim(farm)) == 1


def test_a_user_order_key_is_kept_and_serves_as_the_schedules(farm):
    farm.settings(**FAST)
    farm.schedule("k", farm.python_spec(pyjobs.noop, order_key="mine"), every=STEP, overlap="skip")
    farm._store.count(update(schedules).values(next_run=farm._store.ask_time() - 3 * STEP))
    pass_(farm)
    assert {j["order_key"] for j in made(farm, "k")} == {"mine"}


def test_an_edit_to_an_overlap_policy_gives_the_waiting_occurrences_the_key(farm):
    waiting = behind(farm, "e")
    assert farm.edit_schedule("e", overlap="skip")["overlap"] == "skip"
    assert {j["order_key"] for j in made(farm, "e")} == {"schedule:e"} and waiting
    farm.edit_schedule("e", overlap="allow")
    assert {j["order_key"] for j in made(farm, "e")} == {None}


def test_jitter_is_the_same_on_every_machine_and_keys_keep_the_occurrence_time(farm, db_url):
    waiting = behind(farm, "j", jitter=30.0)
    for job in waiting:
        due = due_of("j", job["key"], job["created_at"])
        assert abs(job["run_at"] - (due + jitter_of(job["key"], 30.0))) < 1e-3
        assert 0 <= job["run_at"] - due < 30.0
    assert len({round(j["run_at"] - due_of("j", j["key"], 0), 3) for j in waiting}) > 1  # each its own delay
    row, now = farm.get_schedule("j"), farm._store.ask_time()
    with Farm(db_url) as other:  # another machine computes the same
        assert upcoming_runs(other.get_schedule("j"), now) == upcoming_runs(row, now)
    upcoming = upcoming_runs(row, now)
    assert len(upcoming) == 5 and upcoming == sorted(upcoming) and all(t > now for t in upcoming)


def test_backfill_makes_each_occurrence_of_a_past_range_once(farm, db_url):
    farm.settings(**FAST)
    farm.schedule("h", farm.python_spec(pyjobs.noop), every=3600)
    now = farm._store.ask_time()
    start, end = now - 5 * 3600, now - 1
    hourly = Recurrence(every=3600.0)
    expected = {f"h@{hourly.label(t)}" for t in (hourly.after(start - 0.001) + 3600 * i for i in range(5))}
    counts: list[int] = []

    def backfill() -> None:
        with Farm(db_url) as other:
            counts.append(other.backfill_schedule("h", start, end))

    threads = [threading.Thread(target=backfill) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(counts) == 5
    assert farm.backfill_schedule("h", start, end) == 0
    keys = [j["key"] for j in made(farm, "h")]
    assert expected <= set(keys) and len(keys) == len(set(keys))
    assert any(e["subject"] == "h" for e in events(farm, "schedule.backfilled"))


def test_pause_until_is_resumed_by_the_farm_once_at_that_time(farm):
    farm.settings(**FAST)
    farm.schedule("p", farm.python_spec(pyjobs.noop), every=STEP)
    until = farm._store.ask_time() + 3600
    farm.pause_schedule("p", until=until)
    row = farm.get_schedule("p")
    assert row["paused"] and row["paused_until"] == pytest.approx(until)
    pass_(farm)
    assert farm.get_schedule("p")["paused"]  # not yet
    farm._store.count(update(schedules).values(paused_until=farm._store.ask_time() - 0.01))  # its time came
    pass_(farm)
    pass_(farm)
    row = farm.get_schedule("p")
    assert not row["paused"] and row["paused_until"] is None
    resumed = [e for e in events(farm, "schedule.resumed") if e["subject"] == "p"]
    assert len(resumed) == 1 and "paused until" in resumed[0]["detail"]


def test_pause_on_failure_pauses_after_n_failures_in_a_row_and_a_success_resets(farm):
    waiting = behind(farm, "f", occurrences=6, pause_on_failure=2)
    ids = [j["id"] for j in waiting]

    def end(job_id: int, state: str) -> None:
        farm._store.count(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(state=state, finished_at=farm._store.ask_time(), last_error="boom")
        )

    end(ids[0], "failed")
    end(ids[1], "succeeded")
    end(ids[2], "failed")
    pass_due(farm, "f")
    assert not farm.get_schedule("f")["paused"] and farm.get_schedule("f")["failures"] == 1
    end(ids[3], "cancelled")  # a skipped occurrence neither counts nor resets
    end(ids[4], "failed")
    pass_(farm)
    assert not farm.get_schedule("f")["paused"]  # counted as its occurrences are made, not at every turn
    pass_due(farm, "f")
    row = farm.get_schedule("f")
    assert (
        row["paused"]
        and row["paused_why"] == f"paused on failure: 2 runs in a row failed for good (the last, job {ids[4]}: boom)"
    )
    [paused] = [e for e in events(farm, "schedule.paused") if e["subject"] == "f"]
    assert row["paused_why"] in paused["detail"]
    resumed = farm.resume_schedule("f")
    assert not resumed["paused"] and resumed["paused_why"] is None and not resumed["failures"]


@pytest.mark.parametrize(
    "policy, message",
    [
        (
            dict(overlap="sometimes"),
            "unknown overlap policy 'sometimes': use one of allow, skip, buffer-one, cancel-previous",
        ),
        (dict(jitter=-1.0), "jitter must be from 0 to 86400 seconds (got -1)"),
        (dict(jitter=float("nan")), "jitter must be from 0 to 86400 seconds"),
        (dict(pause_on_failure=0), "pause_on_failure must be from 1 to 1000 runs (got 0)"),
    ],
)
def test_a_bad_policy_is_one_line_and_makes_nothing(farm, policy, message):
    with pytest.raises(InvalidJob, match=f"^{re.escape(message)}"):
        farm.schedule("bad", farm.python_spec(pyjobs.noop), every=STEP, **policy)
    farm.schedule("good", farm.python_spec(pyjobs.noop), every=STEP)
    with pytest.raises(InvalidJob, match=f"^{re.escape(message)}"):
        farm.edit_schedule("good", **policy)
    assert [s["name"] for s in farm.list_schedules()] == ["good"]


def test_bad_backfills_and_pauses_are_one_line(farm):
    farm.schedule("h", farm.python_spec(pyjobs.noop), every=1)
    now = farm._store.ask_time()
    with pytest.raises(InvalidJob, match=r"^a backfill's start \(FROM\) must not be after its end \(TO\)$"):
        farm.backfill_schedule("h", now - 10, now - 20)
    with pytest.raises(
        InvalidJob, match=r"^a backfill covers past occurrences: its end \(TO\) must not be later than now$"
    ):
        farm.backfill_schedule("h", now - 10, now + 3600)
    with pytest.raises(InvalidJob, match=f"^the range holds more than {MAX_BACKFILL} occurrences"):
        farm.backfill_schedule("h", now - 2 * MAX_BACKFILL, now - 1)
    with pytest.raises(NotFound):
        farm.backfill_schedule("ghost", now - 10, now - 1)
    with pytest.raises(InvalidJob, match="^until must be later than now$"):
        farm.pause_schedule("h", until=now - 1)
    assert not farm.get_schedule("h")["paused"]


def test_real_nodes_never_run_a_skip_schedule_twice_at_once_and_list_what_they_skipped(farm):
    """Two nodes, a schedule every 0.2 s whose run takes 0.7 s: the target never serves two of its runs at once, and
    the occurrences that fell due meanwhile are skipped, each with its reason (the turn-holder's pass, woken at every
    turn by the heartbeat's look at the schedules)."""
    with HttpTarget() as target:
        nodes = Nodes(farm, http_base=target.base_url)
        try:
            nodes("a")
            nodes("b")
            farm.schedule("slow", farm.http_spec("/sleep/0.7"), every=0.2, overlap="skip")
            wait_for(lambda: len([r for r in target.requests("/sleep") if r["ended"]]) >= 3, timeout=20)
            farm.pause_schedule("slow")
        finally:
            nodes.stop_all()
        served = target.requests("/sleep")
    assert most_at_once([r for r in served if r["ended"]]) == 1 and len({r["machine"] for r in served}) >= 1
    skipped = [r for r in farm.schedule_runs("slow", limit=200) if (r["error"] or "").startswith("skipped:")]
    assert len(skipped) >= 3 and all("overlap=skip" in r["error"] and r["outcome"] == "cancelled" for r in skipped)


def test_a_failed_run_in_a_blocking_queue_is_counted_before_its_key_is_released(farm):
    farm.settings(**FAST)
    spec = farm.python_spec(pyjobs.noop, queue="strict")
    farm.schedule("s", spec, every=STEP, misfire="all", overlap="skip", pause_on_failure=1)
    farm._store.count(update(schedules).values(next_run=farm._store.ask_time() - 3 * STEP))
    pass_(farm)
    farm.set_queue("strict", on_failure="block")
    [first] = claim(farm)
    now = farm._store.ask_time()
    farm._store.count(update(jobs).where(jobs.c.id == first).values(state="failed", finished_at=now, lease_until=None))
    pass_(farm)
    row = farm.get_schedule("s")
    assert row["paused"] and f"job {first}" in row["paused_why"] and farm.job(first)["order_key"] is None


def test_the_mark_follows_the_oldest_unfinished_run_so_a_pass_reads_only_what_is_left(farm):
    waiting = behind(farm, "m", overlap="skip")
    [running] = claim(farm)
    started_long_ago(farm, running)
    pass_(farm)  # skips those that fell due
    assert farm.get_schedule("m")["counted"] == running - 1
    farm._store.count(
        update(jobs).where(jobs.c.id == running).values(state="succeeded", finished_at=farm._store.ask_time())
    )
    asked = farm.run_schedule("m")  # the one unfinished job left
    pass_(farm)
    assert farm.get_schedule("m")["counted"] == asked - 1 > running and waiting
