"""Snoozes end to end: a target answering 429 with Retry-After, a Python job calling context.snooze (sync, async, a
batch function's entry), a command exiting 75: each job is put back for the time asked without spending an attempt,
and the target's own record shows it was not called again before that time."""

import json

import pytest

from queueprocessor.farm import Farm
from tests.support import pyjobs
from tests.support.work import FAST, NodeProcesses, Nodes, wait_for

ENDED = ("succeeded", "failed", "cancelled")


def finished(farm, job_id, timeout=20.0):
    return wait_for(lambda: (j := farm.job(job_id))["state"] in ENDED and j, timeout=timeout)


def by_run(job):
    """The job's runs, first first: (attempt, outcome)."""
    return [(r["attempt"], r["outcome"]) for r in sorted(job["runs"], key=lambda r: r["fence"])]


@pytest.mark.postgres
def test_a_throttled_target_is_called_again_no_earlier_than_its_retry_after(pg_url, http_target, tmp_path):
    """Real node processes, a real HTTP target answering 429 with Retry-After twice then 200: the job succeeds on its
    first attempt (max_attempts=1: a spent attempt would fail it), each call no earlier than the previous answer's
    Retry-After said, whether it said seconds or an HTTP-date; a 429 without Retry-After spends an attempt."""
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
        procs = NodeProcesses(pg_url, tmp_path)
        try:
            for name in ("a", "b"):
                procs(name, "--http-base", http_target.base_url)
            wait_for(lambda: len(farm.serving("default")) == 2, timeout=30)
            seconds = farm.enqueue_http("throttled/2/1", max_attempts=1)[0]
            date = farm.enqueue_http("throttled/1/2/date", max_attempts=1)[0]
            bare = farm.enqueue_http("status/429", max_attempts=2)[0]
            jobs = {job_id: finished(farm, job_id) for job_id in (seconds, date, bare)}
        finally:
            procs.kill_all()
        farm._store.give_back()
    for job_id, asked, times in ((seconds, 1.0, 2), (date, 2.0, 1)):
        job = jobs[job_id]
        assert (job["state"], job["attempts"], job["snoozes"]) == ("succeeded", 1, times)
        assert by_run(job) == [(1, "snoozed")] * times + [(1, "succeeded")]
        calls = [r for r in http_target.requests("/throttled/") if r["job"] == job_id]
        assert [(c["attempt"], c["status"]) for c in calls] == [(1, 429)] * times + [(1, 200)]
        for before, after in zip(calls, calls[1:]):
            assert after["started"] >= before["ended"] + asked, "called again before its Retry-After"
    snoozed = [r for r in jobs[seconds]["runs"] if r["outcome"] == "snoozed"]
    assert all(r["error"].endswith("answered HTTP 429, Retry-After 1; back in 1 s") for r in snoozed)
    bare_job = jobs[bare]
    assert (bare_job["state"], bare_job["attempts"], bare_job["snoozes"]) == ("failed", 2, None)
    assert by_run(bare_job) == [(1, "failed"), (2, "failed")]
    assert "answered HTTP 429 with no Retry-After" in bare_job["last_error"]


@pytest.fixture
def nodes(farm):
    pyjobs.SNOOZED.clear()  # job ids start at 1 again in each test's fresh database
    started = Nodes(farm)
    yield started
    started.stop_all()


@pytest.mark.parametrize("function", [pyjobs.snooze_twice, pyjobs.snooze_twice_async])
def test_a_python_job_that_snoozes_runs_again_on_the_same_attempt(farm, nodes, function):
    nodes("a")
    job_id = function.enqueue(farm, 0.2)
    job = finished(farm, job_id)
    assert (job["state"], job["attempts"], job["snoozes"]) == ("succeeded", 1, 2)
    assert by_run(job) == [(1, "snoozed"), (1, "snoozed"), (1, "succeeded")]
    assert json.loads(job["runs"][0]["output"]) == {"runs": 3}
    assert pyjobs.SNOOZED[job_id] == [1, 1, 1], "the job saw the same attempt each time"
    assert {r["error"] for r in job["runs"] if r["outcome"] == "snoozed"} == {"not yet; back in 0.2 s"}


def test_a_batch_function_snoozes_one_job_of_its_call_alone(farm, nodes):
    nodes("a")
    ids = [pyjobs.batch_snooze_odd.enqueue(farm, n) for n in range(4)]
    jobs = {n: finished(farm, job_id) for n, job_id in enumerate(ids)}
    for n, job in jobs.items():
        assert (job["state"], job["attempts"]) == ("succeeded", 1)
        assert by_run(job) == ([(1, "snoozed")] if n % 2 else []) + [(1, "succeeded")]


def test_a_snooze_raised_out_of_a_batch_call_snoozes_every_job_of_it(farm, nodes):
    nodes("a")
    ids = farm.enqueue_python(pyjobs.batch_snooze_all, count=3)
    for job_id in ids:
        job = finished(farm, job_id)
        assert (job["state"], job["attempts"], job["snoozes"]) == ("succeeded", 1, 1)
        assert by_run(job) == [(1, "snoozed"), (1, "succeeded")]
        assert min(job["runs"], key=lambda r: r["fence"])["error"] == "all of them; back in 0.2 s"


def test_a_command_exiting_75_is_snoozed_for_its_last_retry_after_line(farm, nodes, tmp_path):
    """Exit code 75 (EX_TEMPFAIL) with `retry-after: SECONDS` lines: the last one says how long; the second run,
    finding its mark, succeeds, on the same attempt."""
    nodes("a")
    mark = tmp_path / "ran"
    script = (
        f'if [ -e {mark} ]; then exit 0; fi; : > {mark}; echo "retry-after: 30"; printf "retry-after: 0.3"; exit 75'
    )
    [job_id] = farm.enqueue_command(["sh", "-c", script], max_attempts=1)
    job = finished(farm, job_id)
    assert (job["state"], job["attempts"], job["snoozes"]) == ("succeeded", 1, 1)
    assert by_run(job) == [(1, "snoozed"), (1, "succeeded")]
    snoozed, ran = sorted(job["runs"], key=lambda r: r["fence"])
    assert snoozed["error"] == "command 'sh' exited 75 (retry-after: 0.3); back in 0.3 s"
    assert ran["started_at"] >= snoozed["finished_at"] + 0.3, "started again before the time it asked for"


def test_a_command_exiting_75_without_a_retry_after_line_waits_the_default(farm, nodes):
    nodes("a")
    [job_id] = farm.enqueue_command(["sh", "-c", "echo busy; exit 75"], max_attempts=1)
    job = wait_for(lambda: (j := farm.job(job_id))["snoozes"] and j)
    assert (job["state"], job["attempts"]) == ("queued", 0)
    assert job["last_error"] == "command 'sh' exited 75 (no retry-after line); back in 60 s"
    assert job["run_at"] >= job["runs"][0]["finished_at"] + 60
