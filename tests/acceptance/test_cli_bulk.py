"""`retry`, `cancel` and `delete` over a filter, and `jobs --search`, as a user runs them (real subprocesses)."""

import json
import re
import signal
import subprocess
import sys

from sqlalchemy import update

from queueprocessor import JobFilter
from queueprocessor.farm import Farm
from queueprocessor.store.schema import jobs
from tests.acceptance.test_cli import run
from tests.support.work import wait_for


def _jobs(url):
    with Farm(url) as farm:
        return {j["id"]: j for j in farm.find_jobs(JobFilter(), limit=1_000)}


def test_bulk_commands_act_on_what_the_filter_picks_and_say_how_many(tmp_path):
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    with Farm(url) as farm:
        mondays = farm.enqueue_http("/report", payload='{"day": "monday", "shop": {"id": 7}}', count=3)
        [tuesday] = farm.enqueue_http("/report", payload='{"day": "tuesday"}')
        [other] = farm.enqueue_http("/other", queue="reports")

    listed = run("jobs", "--search", "day=monday shop.id=7", "--json", db=url)
    assert listed.returncode == 0, listed.stderr
    assert sorted(j["id"] for j in json.loads(listed.stdout)["jobs"]) == sorted(mondays)

    done = run("cancel", "--target", "/report", "--search", "day=monday", db=url)
    assert (done.returncode, done.stdout.strip()) == (0, "3 jobs cancelled (running ones stop within a heartbeat)")
    states = {j: row["state"] for j, row in _jobs(url).items()}
    assert states == {**{j: "cancelled" for j in mondays}, tuesday: "queued", other: "queued"}

    done = run("retry", "--state", "cancelled", "--older-than", "3600", db=url)
    assert (done.returncode, done.stdout.strip()) == (0, "0 jobs queued again")  # they were cancelled just now
    done = run("delete", "--search", "queue:default", db=url)
    assert (done.returncode, done.stdout.strip()) == (0, "3 jobs deleted")  # the finished ones only
    assert sorted(_jobs(url)) == sorted([tuesday, other])


def test_a_bulk_command_refuses_an_empty_filter_or_a_bad_search_in_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    with Farm(url) as farm:
        [job] = farm.enqueue_http("/x")

    for args, said in [
        (["delete"], "error: give a job id, a filter, or --all to delete every job it can"),
        (["retry", str(job), "--state", "failed"], "error: give a job id or a filter, not both"),
        (["jobs", "--search", "a.=1"], "error: --search term 'a.=1' is not understood: a field is letters"),
        (["cancel", "--search", 'x="open'], "error: --search term 'x=\"open' is not understood: a double quote"),
        (["delete", str(job)], f"error: job {job} is queued; only finished jobs can be deleted"),
    ]:
        done = run(*args, db=url)
        assert done.returncode != 0 and done.stderr.startswith(said), (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1
    done = run("delete", "--all", db=url)
    assert (done.returncode, done.stdout.strip()) == (0, "0 jobs deleted")
    assert list(_jobs(url)) == [job]


def test_ctrl_c_stops_a_bulk_retry_between_batches_and_says_how_far_it_got(tmp_path):
    """SIGINT once the first batch is in: the command says how many it changed, and that is exactly how many
    jobs were retried, each whole, the others untouched."""
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    total = 100_000
    with Farm(url) as farm:
        farm.enqueue_http("/t", count=total, max_attempts=1)
        # As a final failure leaves them (a claim and finish of each would only slow the test).
        farm._store.count(update(jobs).values(state="failed", attempts=1, finished_at=1.0))

    def queued():
        with Farm(url, read_only=True) as farm:
            return farm.job_counts()["queued"]

    command = [sys.executable, "-m", "queueprocessor.cli", "--db", url, "retry", "--state", "failed"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: queued() >= 1_000 or process.poll() is not None, timeout=60, interval=0.01)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, (out, err)
    said = int(re.match(r"stopped: (\d+) jobs queued again before Ctrl-C; the rest are untouched$", err.strip())[1])
    with Farm(url) as farm:
        rows = farm.find_jobs(JobFilter(), limit=total)
    retried = [j for j in rows if j["state"] == "queued"]
    assert 0 < said == len(retried) < total and said % 1_000 == 0
    assert all(j["finished_at"] is None and j["max_attempts"] == 2 for j in retried)
    assert all(
        j["state"] == "failed" and j["finished_at"] == 1.0 and j["max_attempts"] == 1 for j in rows if j not in retried
    )
