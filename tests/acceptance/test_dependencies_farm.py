"""Dependencies on a real farm: `queueprocessor node` processes on a real PostgreSQL server, an HTTP target that
records when each request started and ended, and the CLI as a user runs it. What is checked is what the target
saw: no child's request arrived before its parents' requests had ended, a failed parent's child never arrived,
and a group's callback arrived once, after every member, with the counts in its body."""

import json

import pytest

from queueprocessor.farm import Farm
from tests.acceptance.test_cli import run
from tests.support.work import FAST, PYJOBS, NodeProcesses, wait_for

pytestmark = pytest.mark.postgres


@pytest.fixture
def farm(pg_url):
    with Farm(pg_url) as the_farm:
        the_farm.settings(**FAST)
        yield the_farm


@pytest.fixture
def processes(pg_url, tmp_path, http_target):
    started = NodeProcesses(pg_url, tmp_path)
    for name in ("n1", "n2"):
        started(name, "--http-base", http_target.base_url)
    yield started
    started.kill_all()


def by_job(http_target):
    """The target's requests by the job that made them (the last attempt's)."""
    return {r["job"]: r for r in http_target.requests()}


def test_children_arrive_after_their_parents_ended_and_a_failed_parents_never(farm, processes, http_target):
    wait_for(lambda: len(farm.serving("default")) == 2)
    flow = farm.workflow("diamond")
    flow.step("top", farm.http_spec("/sleep/0.2"))
    flow.step("left", farm.http_spec("/sleep/0.1"), after=["top"])
    flow.step("right", farm.http_spec("/sleep/0.3"), after=["top"])
    flow.step("bottom", farm.http_spec("/ok"), after=["left", "right"])
    flow.step("bad", farm.http_spec("/fail", max_attempts=1), after=["top"])
    flow.step("never", farm.http_spec("/ok"), after=["bad", "left"])
    flow.step("cleanup", farm.http_spec("/ok"), after=["bad"], after_ended=True)
    workflow_id = flow.enqueue()
    steps = {s["name"]: s["job_id"] for s in farm.workflow_info(workflow_id)["steps"]}
    wait_for(lambda: farm.workflow_info(workflow_id)["progress"]["done"] == len(steps), timeout=30)
    seen = by_job(http_target)
    for child, parents in {"left": ["top"], "right": ["top"], "bottom": ["left", "right"], "cleanup": ["bad"]}.items():
        for parent in parents:
            assert seen[steps[child]]["started"] >= seen[steps[parent]]["ended"], f"{child} began before {parent} ended"
    assert steps["never"] not in seen, "a child of a failed parent never runs"
    shown = {s["name"]: (s["state"], s["last_error"]) for s in farm.workflow_info(workflow_id)["steps"]}
    assert shown["never"] == ("cancelled", f"parent {steps['bad']} failed")
    assert shown["bottom"][0] == shown["cleanup"][0] == "succeeded"

    done = run("workflow", "show", str(workflow_id), "--json", db=farm.url)
    assert done.returncode == 0, done.stderr
    assert {s["name"]: s["after"] for s in json.loads(done.stdout)["steps"]}["bottom"] == ["left", "right"]
    table = run("workflow", "show", str(workflow_id), db=farm.url).stdout
    assert table.splitlines()[0] == "workflow 1 'diamond': 7/7 done" and "never" in table


def test_a_python_step_reads_its_parents_results_by_step_name(farm, processes):
    wait_for(lambda: len(farm.serving("default")) == 2)
    flow = farm.workflow()
    flow.step("one", farm.python_spec(f"{PYJOBS}:echo", {"n": 1}))
    flow.step("two", farm.python_spec(f"{PYJOBS}:echo", "two"))
    flow.step("both", farm.python_spec(f"{PYJOBS}:parents"), after=["one", "two"])
    workflow_id = flow.enqueue()
    both = farm.workflow_info(workflow_id)["steps"][2]["job_id"]
    job = farm.wait(both, timeout=30)
    assert job["state"] == "succeeded", job["last_error"]
    one, two = (farm.job(s["job_id"])["runs"][0]["output"] for s in farm.workflow_info(workflow_id)["steps"][:2])
    assert json.loads(job["runs"][0]["output"]) == {"one": json.loads(one), "two": json.loads(two)}


def test_a_groups_callback_arrives_once_after_every_member_with_the_counts(farm, processes, http_target):
    wait_for(lambda: len(farm.serving("default")) == 2)
    members = [farm.http_spec("/sleep/0.1") for _ in range(8)] + [farm.http_spec("/fail", max_attempts=1)]
    group_id = farm.group(members, callback=farm.http_spec("/status/201", method="POST"), name="tiles")
    wait_for(lambda: farm.group_info(group_id)["callback"]["state"] not in ("waiting", "queued", "running"), timeout=30)
    callbacks = http_target.requests("/status/201")
    assert len(callbacks) == 1
    ended = [r["ended"] for r in http_target.requests() if r["path"] != "/status/201"]
    assert len(ended) == 9 and callbacks[0]["started"] >= max(ended)
    body = json.loads(callbacks[0]["body"])
    failed = farm.group_info(group_id)["progress"]["failed_ids"]
    assert (body["total"], body["succeeded"], body["failed"], body["failed_ids"]) == (9, 8, 1, failed)
    shown = run("group", "show", str(group_id), db=farm.url)
    assert shown.returncode == 0 and shown.stdout.splitlines()[0] == "group 1 'tiles': 9/9 done", shown.stderr


def test_the_cli_enqueues_after_and_refuses_an_unknown_parent_in_one_line(farm):
    first = run("enqueue", "http", "/ok", db=farm.url)
    assert first.returncode == 0, first.stderr
    second = run("enqueue", "http", "/ok", "--after", "1", db=farm.url)
    assert second.stdout.strip() == "enqueued job 2"
    assert json.loads(run("jobs", "--json", "--state", "waiting", db=farm.url).stdout)["jobs"][0]["id"] == 2
    refused = run("enqueue", "http", "/ok", "--after", "1,77", db=farm.url)
    assert refused.returncode != 0
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("error: --after names job 77, which does not exist: ")
    assert farm.job_counts()["waiting"] == 1
