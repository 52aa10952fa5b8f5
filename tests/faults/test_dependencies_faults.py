"""Dependencies under SIGKILL churn: 4 real node processes on the suite's PostgreSQL server drain a few hundred
small graphs (chains, diamonds, fan-outs of 50 into one callback) while a node is killed every few seconds and
started again. Judged by the HTTP target's own log: no job started before every parent's request had ended, no
job ran twice at once; and by the database: every callback was released once, with its group's counts, nothing
was lost, and no node logged a traceback."""

import json
import random
import signal
import time

import pytest

from queueprocessor.farm import Farm
from tests.support.work import FAST, NodeProcesses, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

NODES = ("n1", "n2", "n3", "n4")
CHAINS, DIAMONDS, FANS, FAN_OUT = 100, 50, 2, 50
KILLS = 5


@pytest.fixture
def farm(pg_url):
    with Farm(pg_url) as the_farm:
        the_farm.settings(**FAST)
        yield the_farm


def enqueue_graphs(farm: Farm) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """The graphs, each as (child, parents) pairs; and the groups."""
    step = lambda: farm.http_spec("/sleep/0.5", max_attempts=10)  # noqa: E731
    edges: list[tuple[int, list[int]]] = []
    for n in range(CHAINS):
        flow = farm.workflow(f"chain-{n}").step("a", step()).step("b", step(), after=["a"])
        flow_id = flow.step("c", step(), after=["b"]).enqueue()
        ids = {s["name"]: s["job_id"] for s in farm.workflow_info(flow_id)["steps"]}
        edges += [(ids["b"], [ids["a"]]), (ids["c"], [ids["b"]])]
    for n in range(DIAMONDS):
        flow = farm.workflow(f"diamond-{n}").step("top", step())
        flow.step("left", step(), after=["top"]).step("right", step(), after=["top"])
        flow_id = flow.step("bottom", step(), after=["left", "right"]).enqueue()
        ids = {s["name"]: s["job_id"] for s in farm.workflow_info(flow_id)["steps"]}
        edges += [(ids["left"], [ids["top"]]), (ids["right"], [ids["top"]])]
        edges.append((ids["bottom"], [ids["left"], ids["right"]]))
    groups = [
        farm.group(
            [step() for _ in range(FAN_OUT)], callback=farm.http_spec("/status/201", method="POST", max_attempts=10)
        )
        for _ in range(FANS)
    ]
    return edges, groups


def test_graphs_keep_their_order_and_callbacks_run_once_through_sigkills(farm, pg_url, tmp_path, http_target):
    processes = NodeProcesses(pg_url, tmp_path)
    try:
        for name in NODES:
            processes(name, "--http-base", http_target.base_url, capacity=8)
        wait_for(lambda: len(farm.serving("default")) == len(NODES), timeout=30)
        edges, groups = enqueue_graphs(farm)
        total = sum(farm.job_counts().values())
        chance = random.Random(27)
        for _ in range(KILLS):
            time.sleep(chance.uniform(1.5, 3.0))
            victim = chance.choice(NODES)
            processes.procs[victim].send_signal(signal.SIGKILL)
            processes.procs[victim].wait()
            processes(victim, "--http-base", http_target.base_url, capacity=8)
        wait_for(lambda: farm.job_counts()["succeeded"] == total, timeout=180)
    finally:
        processes.kill_all()

    requests: dict[int, list[dict]] = {}
    for r in http_target.requests():
        requests.setdefault(r["job"], []).append(r)
    assert not http_target.concurrent_overlaps(), "a job ran twice at once"
    for child, parents in edges:
        first = min(r["started"] for r in requests[child])
        for parent in parents:
            assert first >= max(r["ended"] for r in requests[parent]), f"job {child} began before parent {parent} ended"
    for group_id in groups:
        info = farm.group_info(group_id)
        callback = farm.job(info["callback"]["id"])
        outcomes = [run["outcome"] for run in reversed(callback["runs"])]
        assert outcomes[-1] == "succeeded" and set(outcomes[:-1]) <= {"lost"}, "released once, ended once"
        body = json.loads(requests[callback["id"]][-1]["body"])
        assert (body["total"], body["succeeded"], body["failed_ids"]) == (FAN_OUT, FAN_OUT, [])
    assert farm.job_counts()["succeeded"] == total, "nothing lost"
    assert any(run["outcome"] == "lost" for run in farm._store.runs.read()), "a kill cut a run short"
    logs = [path.read_text() for path in tmp_path.glob("*.log")]
    assert not [log for log in logs if "Traceback" in log], "a node logged a traceback"
