"""The farm's event log as a user sees it: a real node's life (joining, asked to drain by an operator, draining,
leaving) is logged as it happens, and `events` prints it, filtered by kind, in a table or JSON."""

import json
import subprocess
import sys

import pytest

from queueprocessor.farm import Farm
from queueprocessor.rules.events import machine_label
from tests.support.pyjobs import SEEN
from tests.support.tcpproxy import TcpProxy
from tests.support.work import FAST, PYJOBS, Nodes, wait_for


def cli(url: str, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "queueprocessor.cli", "--db", url, "events", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_nodes_life_is_logged_and_events_prints_it(db_url):
    with Farm(db_url) as farm:
        nodes = Nodes(farm)
        try:
            node = nodes("worker")
            farm.steer("worker", "drain")
            wait_for(lambda: node.stopped.is_set())
        finally:
            nodes.stop_all()
    me = machine_label("worker", node.id)
    shown = cli(db_url, "--kind", "machine", "--json")
    assert shown.returncode == 0, shown.stderr
    assert [(e["kind"], e["subject"]) for e in json.loads(shown.stdout)["events"]] == [
        ("machine.joined", me),
        ("machine.asked", me),
        ("machine.draining", me),
        ("machine.left", me),
    ]
    table = cli(db_url, "--since", "600")
    assert table.returncode == 0 and "machine.asked" in table.stdout and "to drain" in table.stdout
    refused = cli(db_url, "--kind", "machines")
    assert refused.returncode != 0 and "--kind must be a kind of event" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.postgres
def test_a_node_cut_off_from_the_database_logs_the_outage_and_its_fence_once_back(pg_server, pg_url):
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
    with (
        TcpProxy("127.0.0.1", pg_server.port) as proxy,
        Farm(pg_url.replace(f":{pg_server.port}/", f":{proxy.port}/")) as farm,
    ):
        nodes = Nodes(farm)
        node = nodes("cut-off")
        try:
            [job_id] = farm.enqueue(farm.python_spec(f"{PYJOBS}:wait_for_cancel"))
            wait_for(lambda: farm.job(job_id)["state"] == "running")
            proxy.cut()
            wait_for(lambda: "noticed" in SEEN.get(job_id, {}))  # the watchdog stopped it
            proxy.restore()
            me = machine_label("cut-off", node.id)
            wait_for(lambda: len(farm.events(600, kind="database")) == 1, timeout=30)
        finally:
            nodes.stop_all()
    [outage] = farm_events(pg_url, "database")
    assert (outage["kind"], outage["subject"], outage["actor"]) == ("database.outage", me, me)
    assert outage["detail"].startswith("no contact for ")
    [fenced] = farm_events(pg_url, "machine.fenced")
    assert fenced["detail"] == "stopped its jobs before their leases ran out (1 time)"


def farm_events(url: str, kind: str) -> list[dict]:
    with Farm(url) as farm:
        return farm.events(600, kind=kind)
