"""Python callables and commands beside HTTP, allow-lists, and the run history every attempt leaves."""

import json
import os
import time

import pytest

from queueprocessor.rules.errors import InvalidJob
from queueprocessor.rules.job import JobSpec
from tests.support import pyjobs
from tests.support.work import Nodes, run_cli, wait_for


@pytest.fixture
def nodes(farm):
    pyjobs.SEEN.clear()  # job ids start at 1 again in each test's fresh database
    started = Nodes(farm)
    yield started
    started.stop_all()


def finished(farm, job_id, timeout=10.0):
    return wait_for(
        lambda: (j := farm.job(job_id))["state"] in ("succeeded", "failed", "cancelled") and j, timeout=timeout
    )


def test_a_python_job_gets_its_payload_and_context_and_its_result_is_kept(farm, nodes):
    node = nodes("a")
    job_id = pyjobs.echo.enqueue(farm, {"day": "2026-11-22"})
    job = finished(farm, job_id)
    assert job["state"] == "succeeded" and job["executor"] == "python" and job["target"] == f"{pyjobs.__name__}:echo"
    assert pyjobs.SEEN[job_id] == {"payload": {"day": "2026-11-22"}, "attempt": 1, "fence": 1, "machine": node.id}
    [run] = job["runs"]
    assert json.loads(run["output"]) == {"echo": {"day": "2026-11-22"}}
    assert (run["machine_id"], run["fence"], run["outcome"]) == (node.id, 1, "succeeded")
    assert run["started_at"] <= run["finished_at"]


def test_a_failing_callable_fails_alone_with_its_error_and_traceback(farm, nodes):
    nodes("a")
    bad = farm.enqueue_python(f"{pyjobs.__name__}:fail", {"n": 1}, max_attempts=1)[0]
    good = farm.enqueue_python(f"{pyjobs.__name__}:noop")[0]
    job = finished(farm, bad)
    assert job["state"] == "failed" and job["last_error"] == "ValueError: bad input {'n': 1}"
    assert 'raise ValueError(f"bad input {payload!r}")' in job["runs"][0]["output"]
    assert finished(farm, good)["state"] == "succeeded"


def test_work_that_can_never_succeed_fails_at_once_with_its_reason(farm, nodes):
    """A callable that is not there, a malformed target, an unknown executor: no retry could help, so the first
    attempt is the last, whatever attempts were allowed."""
    nodes("a")
    spec = dict(max_attempts=5)
    hopeless = {
        "has no attribute 'nothing_here'": farm.enqueue_python(f"{pyjobs.__name__}:nothing_here", **spec)[0],
        "no module named 'tests.support.pyjobs.nosuch'": farm.enqueue_python(f"{pyjobs.__name__}.nosuch:run", **spec)[
            0
        ],
        "is a int, not a function": farm.enqueue_python(f"{pyjobs.__name__}:not_callable", **spec)[0],
        # Straight into the queue, past the door's checks:
        "is not of the form package.module:function": farm._store.jobs.enqueue(
            JobSpec(executor="python", target="no-colon", **spec)
        )[0],
        "unknown executor 'ftp'": farm._store.jobs.enqueue(JobSpec(executor="ftp", target="/x", **spec))[0],
    }
    for reason, job_id in hopeless.items():
        job = finished(farm, job_id)
        assert job["state"] == "failed" and reason in job["last_error"]
        assert [(r["attempt"], r["outcome"]) for r in job["runs"]] == [(1, "failed")], reason


def test_work_a_machine_refuses_by_its_allow_lists_is_retried_where_it_is_allowed(farm, nodes):
    """Allow-lists are each machine's own: one that refuses a job spends an attempt and says why, and the retry may
    run on a machine that allows it (failed for good, it would never reach one)."""
    strict = nodes("strict", allow_modules=[])
    refused = farm._store.jobs.enqueue(JobSpec(executor="python", target=f"{pyjobs.__name__}:noop", max_attempts=3))[0]
    ran = wait_for(lambda: (j := farm.job(refused))["runs"] and j)
    assert ran["state"] == "queued"
    assert "is not allowed on this machine" in ran["last_error"] and "a retry may run" in ran["last_error"]
    strict.stop(drain=False)
    open_minded = nodes("open")
    job = finished(farm, refused, timeout=20)
    assert job["state"] == "succeeded"
    assert [(r["machine_id"], r["outcome"]) for r in sorted(job["runs"], key=lambda r: r["attempt"])] == [
        (strict.id, "failed"),
        (open_minded.id, "succeeded"),
    ]


def test_a_timeout_tells_the_callable_through_its_flag(farm, nodes):
    nodes("a")
    job_id = farm.enqueue_python(f"{pyjobs.__name__}:wait_for_cancel", timeout=0.3, max_attempts=1)[0]
    job = finished(farm, job_id)
    assert job["state"] == "failed" and job["runs"][0]["outcome"] == "timeout"
    assert "noticed" in pyjobs.SEEN[job_id]  # it would have run for ever otherwise


@pytest.mark.parametrize("target", ["wait_for_cancel", "sleep_async"])  # told through its flag; cancelled on the loop
def test_cancelling_a_running_python_job_stops_it_within_a_heartbeat(farm, nodes, target):
    nodes("a")
    job_id = farm.enqueue_python(f"{pyjobs.__name__}:{target}")[0]
    wait_for(lambda: job_id in pyjobs.SEEN)
    asked = time.monotonic()
    assert farm._store.jobs.cancel(job_id) == "cancelling"
    job = finished(farm, job_id)
    assert job["state"] == "cancelled" and [r["outcome"] for r in job["runs"]] == ["cancelled"]
    assert pyjobs.SEEN[job_id]["noticed"] - asked < 1.0  # heartbeats are 0.2 s here


def test_an_async_callable_runs_on_the_nodes_loop_and_a_timeout_cancels_it(farm, nodes):
    nodes("a")
    done = farm.enqueue_python(f"{pyjobs.__name__}:echo_async", [1, 2])[0]
    stuck = farm.enqueue_python(f"{pyjobs.__name__}:sleep_async", timeout=0.3, max_attempts=1)[0]
    job = finished(farm, done)
    assert job["state"] == "succeeded" and json.loads(job["runs"][0]["output"]) == {"echo": [1, 2], "job": done}
    job = finished(farm, stuck)
    assert job["runs"][0]["outcome"] == "timeout" and "noticed" in pyjobs.SEEN[stuck]  # it was cancelled


def test_cancelling_a_running_command_kills_it_within_a_heartbeat(farm, nodes, tmp_path):
    nodes("a")
    pid_file = tmp_path / "pid"
    job_id = farm.enqueue_command(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 30"])[0]
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip())
    pid = int(pid_file.read_text())
    asked = farm._store.ask_time()
    assert farm._store.jobs.cancel(job_id) == "cancelling"
    job = finished(farm, job_id)
    [run] = job["runs"]
    assert job["state"] == "cancelled" and run["outcome"] == "cancelled"
    assert run["finished_at"] - asked < 1.0  # heartbeats are 0.2 s here; SIGTERM ends `sleep` at once
    wait_for(lambda: not _alive(pid), timeout=3.0)


def test_a_command_runs_without_a_shell_with_payload_on_stdin(farm, nodes):
    nodes("a")
    literal = farm.enqueue_command(["printf", "%s|", "$HOME", "a b", "; rm -rf /"])[0]
    stdin = farm.enqueue_command(["cat"], {"id": 7})[0]
    env = farm.enqueue_command(["sh", "-c", 'echo "$QP_JOB_ID/$QP_ATTEMPT/$QP_FENCE"'])[0]
    assert finished(farm, literal)["runs"][0]["output"] == "$HOME|a b|; rm -rf /|"
    assert json.loads(finished(farm, stdin)["runs"][0]["output"]) == {"id": 7}
    assert finished(farm, env)["runs"][0]["output"] == f"{env}/1/1\n"


def test_a_failing_command_keeps_the_end_of_its_output(farm, nodes):
    nodes("a")
    script = "for i in $(seq 1 3000); do echo line $i; done; echo 'disk full' >&2; exit 3"
    job = finished(farm, farm.enqueue_command(["sh", "-c", script], max_attempts=1)[0])
    assert job["last_error"] == "command 'sh' failed: exit code 3"
    output = job["runs"][0]["output"]
    assert output.endswith("line 3000\ndisk full\n") and len(output) <= 4001 and "line 1\n" not in output


def test_a_timeout_kills_the_command_and_its_children(farm, nodes, tmp_path):
    nodes("a")
    pids = tmp_path / "pids"
    script = f"sleep 30 & echo $! >> {pids}; echo $$ >> {pids}; wait"
    job = finished(farm, farm.enqueue_command(["sh", "-c", script], timeout=0.5, max_attempts=1)[0])
    assert job["runs"][0]["outcome"] == "timeout"
    for pid in map(int, pids.read_text().split()):
        wait_for(lambda: not _alive(pid), timeout=3.0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"  # a zombie is dead, only not yet reaped


def test_work_no_live_machine_allows_is_refused_at_the_door(farm, nodes):
    nodes("a")
    with pytest.raises(InvalidJob, match="command 'rm' is not allowed on any live machine; allowed: sh, cat"):
        farm.enqueue_command(["rm", "-rf", "/tmp/x"])
    with pytest.raises(InvalidJob, match="Python module 'os' is not allowed on any live machine"):
        farm.enqueue_python("os:system", "true")
    with pytest.raises(InvalidJob, match="host 'example.com' is not allowed on any live machine"):
        farm.enqueue_http("http://example.com/steal")
    with pytest.raises(InvalidJob, match="unknown executor 'ftp'"):
        farm.enqueue(JobSpec(executor="ftp", target="/x"))
    assert farm._store.jobs.counts()["queued"] == 0


def test_work_that_slipped_past_the_door_fails_alone_at_run_time(farm, nodes):
    """Inserted straight into the queue (as SQL or an older client could), refused by the node's own lists."""
    nodes("a")
    rogue = farm._store.jobs.enqueue(
        JobSpec(executor="command", target='["rm", "-rf", "/tmp/nothing"]', max_attempts=1)
    )[0]
    module = farm._store.jobs.enqueue(JobSpec(executor="python", target="os:system", payload='"true"', max_attempts=1))[
        0
    ]
    host = farm._store.jobs.enqueue(JobSpec(executor="http", target="http://example.com/", max_attempts=1))[0]
    good = farm.enqueue_command(["sh", "-c", "echo fine"])[0]
    assert "command 'rm' is not allowed on this machine" in finished(farm, rogue)["last_error"]
    assert "Python module 'os' is not allowed on this machine" in finished(farm, module)["last_error"]
    assert "host 'example.com' is not allowed on this machine" in finished(farm, host)["last_error"]
    assert finished(farm, good)["runs"][0]["output"] == "fine\n"


def test_every_attempt_leaves_a_run_row_and_a_failed_job_can_be_retried(farm, nodes):
    node = nodes("a")
    job_id = farm.enqueue_python(f"{pyjobs.__name__}:fail", "x", max_attempts=2)[0]
    job = finished(farm, job_id, timeout=15)
    runs = sorted(job["runs"], key=lambda r: r["attempt"])
    assert [(r["attempt"], r["fence"], r["outcome"], r["machine_id"]) for r in runs] == [
        (1, 1, "failed", node.id),
        (2, 2, "failed", node.id),
    ]
    assert runs[1]["started_at"] - runs[0]["finished_at"] >= 0.5  # backed off (at least half the base)
    farm._store.jobs.retry(job_id)
    again = finished(farm, job_id, timeout=15)
    assert [r["attempt"] for r in again["runs"]] == [3, 2, 1] and again["state"] == "failed"


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["enqueue", "python", "no-colon"],
            "error: Python job target 'no-colon' is not of the form package.module:function",
        ),
        (["enqueue", "command", "--payload", "{oops", "--", "ls"], "error: payload is not valid JSON"),
        (["enqueue", "http", "ftp://host/x"], "error: HTTP job target 'ftp://host/x' is neither a path"),
        (["enqueue", "command", "--", "[not json"], None),  # an argv word may look like anything: accepted
    ],
)
def test_bad_work_is_one_clear_line_at_the_cli(farm, argv, message, capsys):
    code = run_cli("--db", farm.url, *argv)
    out, err = capsys.readouterr()
    if message is None:
        assert code == 0 and "enqueued job" in out
    else:
        assert code == 1 and err.startswith(message) and err.count("\n") == 1
