"""The farm's event log as a user sees it: a real node's life (joining, asked to drain by an operator, draining,
leaving) is logged as it happens, and `events` prints it, filtered by kind, in a table or JSON."""

import json
import subprocess
import sys

from queueprocessor.farm import Farm
from queueprocessor.rules.events import machine_label
from tests.support.work import Nodes, wait_for


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
