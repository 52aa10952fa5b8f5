"""A node's Prometheus metrics (`--metrics-port`), scraped over real HTTP from real nodes on a real database: the
counters and gauges move as jobs run and as the database goes away, one machine exports the farm-wide gauges, and
a port that cannot be had is one clear line."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import exc

from queueprocessor.farm import Farm
from queueprocessor.node.metrics import WAITING_EVERY
from tests.acceptance.test_node_threads import REFUSE_CHECKIN, install
from tests.support.pyjobs import SEEN
from tests.support.tcpproxy import TcpProxy
from tests.support.work import FAST, PYJOBS, ROOT, Nodes, wait_for


def scrape(url: str) -> dict[tuple, float]:
    """Every sample of a scrape, keyed (name, *sorted label pairs)."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, *sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, *sorted(labels.items())))


def total(nodes, name: str, **labels) -> float:
    """The farm-wide sum of a sample, as a Prometheus `sum()` over the machines would give it."""
    return sum(value(scrape(node.exporter.url), name, **labels) or 0 for node in nodes)


PY = dict(queue="default", executor="python")


def dashboard_names() -> set[str]:
    """The metric names resources/grafana-dashboard.json's queries use."""
    dashboard = json.loads((ROOT / "resources" / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    exprs += [variable["definition"] for variable in dashboard["templating"]["list"] if "definition" in variable]
    return {name for expr in exprs for name in re.findall(r"queueprocessor_\w+", expr)}


@pytest.fixture
def nodes(tmp_path):
    with Farm(f"sqlite:///{tmp_path / 'farm.db'}") as farm:
        started = Nodes(farm, metrics_port=0)
        yield started
        started.stop_all()


def test_two_nodes_serve_metrics_that_move_as_jobs_run_and_one_exports_the_farm_gauges(nodes):
    farm = nodes.farm
    first, second = nodes("first"), nodes("second")
    assert first.exporter.url != second.exporter.url
    before = scrape(first.exporter.url)
    assert value(before, "queueprocessor_machine_info", machine="first", id=str(first.id), version="0.1.0") == 1
    assert value(before, "queueprocessor_jobs_capacity") == 4
    assert value(before, "queueprocessor_database_unreachable") == 0
    assert value(before, "queueprocessor_clock_round_trip_seconds") > 0
    assert value(before, "queueprocessor_jobs_claimed_total", **PY) is None

    [waiting] = farm.enqueue(farm.python_spec(f"{PYJOBS}:wait_for_cancel"))
    wait_for(lambda: total(nodes.started, "queueprocessor_jobs_running") == 1)
    farm.enqueue(farm.python_spec(f"{PYJOBS}:echo", 1), count=3)
    farm.enqueue(farm.python_spec(f"{PYJOBS}:echo", 1, queue="reports"))
    farm.enqueue(farm.python_spec(f"{PYJOBS}:fail", 1, max_attempts=1), count=2)
    farm.enqueue(farm.python_spec(f"{PYJOBS}:wait_for_cancel", max_attempts=1, timeout=0.05))
    farm.cancel(waiting)
    wait_for(lambda: total(nodes.started, "queueprocessor_jobs_finished_total", outcome="failed", **PY) == 2)
    wait_for(lambda: total(nodes.started, "queueprocessor_jobs_finished_total", outcome="timeout", **PY) == 1)
    wait_for(lambda: total(nodes.started, "queueprocessor_jobs_finished_total", outcome="cancelled", **PY) == 1)
    wait_for(lambda: total(nodes.started, "queueprocessor_jobs_finished_total", outcome="succeeded", **PY) == 3)
    assert (
        total(
            nodes.started, "queueprocessor_jobs_finished_total", outcome="succeeded", queue="reports", executor="python"
        )
        == 1
    )
    assert total(nodes.started, "queueprocessor_jobs_claimed_total", queue="reports", executor="python") == 1
    assert total(nodes.started, "queueprocessor_jobs_claimed_total", **PY) == 7
    assert total(nodes.started, "queueprocessor_job_duration_seconds_count", **PY) == 7
    assert total(nodes.started, "queueprocessor_job_duration_seconds_bucket", le="+Inf", **PY) == 7
    assert total(nodes.started, "queueprocessor_job_duration_seconds_sum", **PY) >= 0.05  # the timeout's run
    assert total(nodes.started, "queueprocessor_jobs_running") == 0
    for node in nodes.started:
        wait_for(lambda: value(scrape(node.exporter.url), "queueprocessor_turns_taken_total") >= 2)
        samples = scrape(node.exporter.url)
        assert value(samples, "queueprocessor_turn_lateness_seconds_count") == value(
            samples, "queueprocessor_turns_taken_total"
        )
        assert (
            0
            < value(samples, "queueprocessor_turn_lateness_seconds_sum")
            < 0.2 * samples[("queueprocessor_turns_taken_total",)]
        )  # each turn began inside its slot

    # The farm-wide gauges come from one machine only, so their sum over the farm counts them once.
    farm.enqueue(farm.python_spec(f"{PYJOBS}:echo", 1), delay=3600, count=3)
    farm.enqueue(farm.python_spec(f"{PYJOBS}:echo", 1, queue="reports"), delay=3600)
    assert total(nodes.started, "queueprocessor_farm_reporter") == 1
    wait_for(
        lambda: total(nodes.started, "queueprocessor_farm_jobs_queued", queue="default") == 3, timeout=2 * WAITING_EVERY
    )  # the reporter counts again once its last count is WAITING_EVERY old
    assert total(nodes.started, "queueprocessor_farm_jobs_queued", queue="reports") == 1
    assert total(nodes.started, "queueprocessor_farm_machines_live") == 2
    exported = {key[0] for node in nodes.started for key in scrape(node.exporter.url)}
    assert dashboard_names() <= exported, "the Grafana dashboard asks for a metric no node exports"
    reporter = next(n for n in nodes.started if value(scrape(n.exporter.url), "queueprocessor_farm_reporter"))
    other = second if reporter is first else first
    assert value(scrape(other.exporter.url), "queueprocessor_farm_jobs_queued", queue="default") is None
    reporter.stop(drain=False)  # the other takes over the farm-wide gauges at its next heartbeat
    wait_for(lambda: value(scrape(other.exporter.url), "queueprocessor_farm_reporter") == 1)
    samples = scrape(other.exporter.url)
    assert value(samples, "queueprocessor_farm_machines_live") == 1
    with pytest.raises(OSError):  # the stopped node's endpoint is closed
        scrape(reporter.exporter.url)


@pytest.mark.postgres
def test_a_node_cut_off_from_the_database_counts_failed_renewals_a_self_fence_and_a_lost_job(pg_server, pg_url):
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
    with (
        TcpProxy("127.0.0.1", pg_server.port) as proxy,
        Farm(pg_url.replace(f":{pg_server.port}/", f":{proxy.port}/")) as farm,
    ):
        nodes = Nodes(farm, metrics_port=0)
        node = nodes("cut-off")
        try:
            [job_id] = farm.enqueue(farm.python_spec(f"{PYJOBS}:wait_for_cancel"))
            wait_for(lambda: value(scrape(node.exporter.url), "queueprocessor_jobs_running") == 1)
            proxy.cut()
            wait_for(lambda: "noticed" in SEEN.get(job_id, {}))  # the watchdog stopped it
            samples = scrape(node.exporter.url)  # answered at once: no farm gauge waits on the database
            assert value(samples, "queueprocessor_database_unreachable") == 1
            assert value(samples, "queueprocessor_lease_renewals_failed_total") >= 1
            assert value(samples, "queueprocessor_self_fences_total") == 1
            assert value(samples, "queueprocessor_farm_reporter") is None
            proxy.restore()
            wait_for(
                lambda: (
                    value(scrape(node.exporter.url), "queueprocessor_jobs_finished_total", outcome="lost", **PY) == 1
                ),
                timeout=30,
            )
            wait_for(lambda: value(scrape(node.exporter.url), "queueprocessor_database_unreachable") == 0)
        finally:
            nodes.stop_all()


def test_a_start_that_fails_after_the_endpoint_opened_closes_it(tmp_path):
    with Farm(f"sqlite:///{tmp_path / 'farm.db'}") as farm:
        install(farm, REFUSE_CHECKIN["sqlite"])
        node = farm.node(name="doomed", metrics_port=0, **FAST)
        with pytest.raises(exc.DatabaseError, match="check-in refused by the test"):
            node.start()
    with pytest.raises(OSError):  # and its thread is gone (the suite's no_leaked_threads fixture checks)
        scrape(node.exporter.url)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_cli_node_serves_metrics_on_the_port_its_config_names(tmp_path):
    url, port = f"sqlite:///{tmp_path / 'farm.db'}", free_port()
    config = tmp_path / "qp.toml"
    config.write_text(f"[node]\nmetrics-port = {port}\nperiod = 0.2\nheartbeat = 0.2\n")
    with open(tmp_path / "node.log", "w") as log:
        node = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "queueprocessor.cli",
                "--db",
                url,
                "--config",
                str(config),
                "node",
                "--name",
                "headless",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        info = dict(name="queueprocessor_machine_info", machine="headless", id="1", version="0.1.0")
        metrics = f"http://127.0.0.1:{port}/metrics"
        wait_for(lambda: value(_scrape_when_up(metrics), **info) == 1, timeout=30)
        wait_for(lambda: value(scrape(metrics), "queueprocessor_turns_taken_total") > 0)  # started: a turn taken
        assert value(scrape(metrics), "process_cpu_seconds_total") > 0
    finally:
        node.send_signal(signal.SIGTERM)
        assert node.wait(30) == 0
    assert f"serving metrics at http://127.0.0.1:{port}/metrics" in (tmp_path / "node.log").read_text()


def _scrape_when_up(url: str) -> dict:
    try:
        return scrape(url)
    except OSError:  # not listening yet
        return {}


def test_a_metrics_port_in_use_is_one_line_and_the_node_does_not_join(tmp_path):
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "queueprocessor.cli", "--db", url, "node"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "QP_METRICS_PORT": str(port)},
        )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"error: cannot serve metrics on 127.0.0.1 port {port}: the port is in use; "
        "choose another --metrics-port or --metrics-host"
    ]
    with Farm(url) as farm:
        assert farm.status()["machines"] == []


def test_a_node_that_serves_no_metrics_never_loads_prometheus_client(tmp_path):
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    script = (
        "import sys; from queueprocessor.farm import Farm\n"
        f"farm = Farm({url!r})\n"
        "farm.node(name='quiet').start().stop(drain=False); farm.close()\n"
        "print('prometheus_client' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.stdout.split() == ["False"], done.stderr
