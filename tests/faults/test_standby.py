"""A farm on a replicated PostgreSQL fails over with its database (docs/deploy.md).

A real primary and a real streaming standby (pg_basebackup -R); a node process configured as the systemd unit
configures it (resources/deploy/node.env) with a two-host URL and target_session_attrs=read-write. The primary
goes away while jobs run, and the standby is promoted only after the leases have run out: the node stops its
jobs itself (self-fencing), finds the new primary through the same URL, takes the jobs back and runs them, and
runs the work enqueued after the promotion. Nothing is lost, and no job runs twice at once.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from queueprocessor.farm import Farm
from queueprocessor.rules.states import JobState, Outcome
from tests.support.pgserver import PostgresServer
from tests.support.standby import StandbyServer
from tests.support.work import wait_for

ROOT = Path(__file__).resolve().parents[2]
TIMING = {"period": 0.5, "heartbeat": 0.5, "misses": 3}  # a lease of 1.5 s, self-fencing at 1.0 s

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def service_environment(path: Path, **ours: str) -> dict[str, str]:
    """An EnvironmentFile read as systemd reads it (NAME=value lines, # comments), with the test's own values."""
    given = dict(
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    assert set(ours) <= set(given), "the example env file names every variable the test sets"
    return {k: v for k, v in os.environ.items() if not k.startswith("QP_")} | given | ours


def two_host_url(primary: PostgresServer, standby: PostgresServer, database: str) -> str:
    return (
        f"postgresql://{primary.user}:{primary.password}@/{database}?host=127.0.0.1:{primary.port}"
        f"&host=127.0.0.1:{standby.port}&target_session_attrs=read-write"
    )


@pytest.fixture
def replicated():
    with PostgresServer() as primary:
        primary.create_database("farm")
        with StandbyServer(primary) as standby:
            yield primary, standby


def test_a_node_follows_its_database_through_a_failover(replicated, http_target, tmp_path):
    primary, standby = replicated
    url = two_host_url(primary, standby, "farm")
    with Farm(url) as farm:
        farm.settings(**TIMING)
    env = service_environment(
        ROOT / "resources" / "deploy" / "node.env", QP_DB=url, QP_NAME="web-3", QP_HTTP_BASE=http_target.base_url
    )
    with open(tmp_path / "node.log", "w") as log:
        node = subprocess.Popen(
            [sys.executable, "-m", "queueprocessor.cli", "node"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        with Farm(url) as farm:
            running = farm.enqueue_http("/sleep/3", count=4)
            wait_for(lambda: all(farm.job(j)["state"] == JobState.RUNNING for j in running), timeout=15)
        primary.halt()  # a clean shutdown: every committed row has reached the standby
        time.sleep(TIMING["heartbeat"] * TIMING["misses"] + 1.0)  # the leases run out while nothing takes writes
        standby.promote()
        with Farm(url) as farm:  # the same URL now reaches the standby, the only host that takes writes
            later = farm.enqueue_http("/sleep/0.2", count=4)
            wait_for(lambda: all(farm.job(j)["state"] == JobState.SUCCEEDED for j in running + later), timeout=25)
            for job_id in running:
                outcomes = [run["outcome"] for run in sorted(farm.job(job_id)["runs"], key=lambda r: r["fence"])]
                assert outcomes[0] == Outcome.LOST and outcomes[-1] == Outcome.SUCCEEDED, outcomes
            [machine] = farm.status()["machines"]
            assert (machine["name"], machine["status"]) == ("web-3", "active")
        assert node.poll() is None, (tmp_path / "node.log").read_text()
        assert http_target.concurrent_overlaps() == []
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(20)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()
