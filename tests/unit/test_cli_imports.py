"""A command loads what it needs and no more: `--help` answers without SQLAlchemy, and commands that
only write or read rows never load a node, its runner, the executors or aiohttp (nor the metrics library a node
serves). Each case is a real `queueprocessor` process; it reports the modules it ended with."""

import json
import os
import signal
import subprocess
import sys

import pytest
from sqlalchemy import func, select, text

from queueprocessor.farm import Farm
from queueprocessor.rules.errors import NotFound
from queueprocessor.store.schema import turns
from tests.support.work import wait_for

# Runs the CLI's entry point as the installed script does, then prints what is loaded as the last line.
PROBE = """
import json, sys
from queueprocessor.cli import main
try:
    main(sys.argv[1:])
finally:
    print(json.dumps(sorted(sys.modules)))
"""
NODE_SIDE = {
    "aiohttp",
    "queueprocessor.node.node",
    "queueprocessor.node.runner",
    "queueprocessor.executors",
    "queueprocessor.node.push",
    "prometheus_client",
    "psycopg",
}


def loaded_by(*args: str, db: str | None = None) -> tuple[set[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QP_", "OTEL_"))} | ({"QP_DB": db} if db else {})
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    *shown, modules = done.stdout.splitlines()
    return set(json.loads(modules)), "\n".join(shown)


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'farm.db'}"


def test_enqueue_writes_its_row_without_loading_a_node(sqlite_url):
    """Nor what only other commands use: the app's views, the demo, a schedule's parser, the config file's parser,
    the data folder (a --db was given), and no other database's dialect (a farm on SQLite builds no PostgreSQL
    statement). Of a node's package it loads only node/config.py, the shape of the farm's timing."""
    modules, shown = loaded_by("enqueue", "http", "/x", db=sqlite_url)
    assert shown == "enqueued job 1"
    assert {"sqlalchemy", "queueprocessor.farm"} <= modules  # it did open the farm
    assert not NODE_SIDE & modules, sorted(NODE_SIDE & modules)
    assert not {name for name in modules if name.startswith("opentelemetry")}, "no trace current: none of it"
    unneeded = {
        "queueprocessor.views",
        "queueprocessor.demo",
        "croniter",
        "tomllib",
        "platformdirs",
        "sqlalchemy.dialects.postgresql",
        "sqlalchemy.dialects.mssql",
    }
    assert not unneeded & modules, sorted(unneeded & modules)
    node_side = {name for name in modules if name.startswith("queueprocessor.node.")}
    assert node_side == {"queueprocessor.node.config"}, sorted(node_side)
    with Farm(sqlite_url) as farm:
        assert [j["target"] for j in farm.list_jobs()] == ["/x"]


@pytest.mark.parametrize("command", [["status"], ["jobs", "--json"], ["schedule", "list"]])
def test_commands_that_read_load_no_node_either(sqlite_url, command):
    Farm(sqlite_url).close()
    modules, _ = loaded_by(*command, db=sqlite_url)
    assert "queueprocessor.farm" in modules and not NODE_SIDE & modules, sorted(NODE_SIDE & modules)


@pytest.mark.parametrize("command", [["--help"], ["enqueue", "http", "--help"], ["node", "--help"]])
def test_help_loads_no_sqlalchemy(command):
    modules, shown = loaded_by(*command)
    assert shown.startswith("Usage: ")
    assert not {"sqlalchemy", "queueprocessor.farm"} & modules


def test_an_idle_node_loads_no_schedule_parser_http_client_metrics_library_or_other_database(db_url):
    """An idle node's memory. What only some work needs is loaded by the first such work: croniter
    (and dateutil) by a cron schedule, aiohttp by an HTTP job, prometheus_client by --metrics-port, OpenTelemetry
    only with an OTLP endpoint named (docs/design.md §12), and platformdirs only by a command given no database;
    and no other database's SQLAlchemy dialect, while the
    partial indexes it built still hold only the rows of their condition (schema.partial_for)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QP_", "OTEL_"))} | {"QP_DB": db_url}
    node = subprocess.Popen(
        [sys.executable, "-c", PROBE, "node", "--name", "idle", "--period", "0.2", "--heartbeat", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_for(lambda: _has_farm(db_url), timeout=30)
        with Farm(db_url) as farm:
            wait_for(lambda: farm._store.rows(select(func.count()).select_from(turns))[0][0] >= 2, timeout=30)
    finally:
        node.send_signal(signal.SIGTERM)
        out, err = node.communicate(timeout=30)
    assert node.returncode == 0, err
    modules = set(json.loads(out.splitlines()[-1]))
    assert "queueprocessor.node.node" in modules
    unneeded = {"croniter", "dateutil", "aiohttp", "prometheus_client", "platformdirs", "sqlalchemy.dialects.mssql"}
    if db_url.startswith("postgresql"):
        unneeded.add("sqlalchemy.dialects.sqlite")
    assert not unneeded & modules, sorted(unneeded & modules)
    assert not {name for name in modules if name.startswith("opentelemetry")}, "no OTLP endpoint: not tracing"
    with Farm(db_url) as farm:
        conditions = farm._store.rows(
            text(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_qp_jobs_queued'"
                if db_url.startswith("postgresql")
                else "SELECT sql FROM sqlite_master WHERE name = 'ix_qp_jobs_queued'"
            )
        )
    assert "WHERE" in conditions[0][0] and "queued" in conditions[0][0], conditions


def _has_farm(url: str) -> bool:
    """Whether the node made its farm's tables yet."""
    try:
        Farm(url, read_only=True).close()
    except NotFound:
        return False
    return True
