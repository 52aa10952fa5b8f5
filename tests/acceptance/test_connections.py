"""What a farm costs its database in connections, and how a database administrator tells them apart,
seen the way the administrator sees them: in pg_stat_activity."""

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import psycopg
import pytest
from sqlalchemy import event, func, select
from sqlalchemy.engine import make_url

from queueprocessor.farm import Farm
from queueprocessor.store.base import KEEP
from queueprocessor.store.database import client_name, open_engine
from tests.support.work import ROOT, Nodes, wait_for

QP = [sys.executable, "-m", "queueprocessor.cli"]
PYJOBS = "tests.support.pyjobs"
IDLE, BUSY = 2, 3  # at most, per node: one connection for statements and one to LISTEN; one more for results


def sessions(url: str) -> list[str]:
    """The application_name of every session on the farm's database but the observer's own."""
    parts = make_url(url)
    with psycopg.connect(
        host=parts.host,
        port=parts.port,
        user=parts.username,
        password=parts.password,
        dbname=parts.database,
        application_name="observer",
        autocommit=True,
    ) as conn:
        return [
            name
            for (name,) in conn.execute(
                "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
        ]


def active(farm: Farm, *names: str) -> bool:
    states = {m["name"]: m["state"] for m in farm.status()["machines"]}
    return all(states.get(name) == "active" for name in names)


@pytest.fixture
def processes():
    """Started processes; any still running at the end is killed."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def per_node(url: str) -> Counter:
    """Sessions per node process (named 'queueprocessor n<i>'), the observer's own and this test's Farm left out."""
    return Counter(name for name in sessions(url) if name.startswith("queueprocessor n"))


def idle(url: str, nodes: int) -> bool:
    """Does every node hold what an idle one may: its statements' connection and its LISTEN one (and the
    connection for results given back after the last job)?"""
    counts = per_node(url)
    return len(counts) == nodes and set(counts.values()) == {IDLE}


def drain(farm: Farm, url: str, jobs: int) -> Counter:
    """Enqueue a backlog and, until it is done, sample pg_stat_activity: the most sessions each node held."""
    done = farm.job_counts().get("succeeded", 0) + jobs
    most: Counter = Counter()
    farm.enqueue(farm.python_spec(f"{PYJOBS}:nap", 0.002), count=jobs)
    deadline = time.monotonic() + 60
    while farm.job_counts().get("succeeded", 0) < done and time.monotonic() < deadline:
        most |= per_node(url)
    assert farm.job_counts().get("succeeded", 0) == done
    return most


@pytest.mark.postgres
@pytest.mark.slow
def test_a_node_holds_two_connections_idle_and_three_busy_whatever_its_capacity(pg_url, processes):
    """1 node, then 8, each of capacity 32: idle, each holds one connection for its statements and one to LISTEN;
    draining a backlog, at most one more."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def start(name):
        processes.append(
            subprocess.Popen(
                [*QP, "--db", pg_url, "node", "--name", name, "--capacity", "32", "--allow-module", PYJOBS],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    with Farm(pg_url) as farm:
        for size in (1, 8):
            for index in range(len(processes), size):
                start(f"n{index}")
            wait_for(lambda: active(farm, *(f"n{i}" for i in range(size))), 60)
            wait_for(lambda: idle(pg_url, size), 30)
            busy = drain(farm, pg_url, jobs=200 * size)
            assert len(busy) == size and max(busy.values()) <= BUSY, busy
            wait_for(lambda: idle(pg_url, size), 30)  # and back


@pytest.mark.postgres
def test_a_node_opens_no_connection_between_bursts_of_jobs_and_gives_one_back_once_idle(pg_url):
    """Jobs that come in bursts a moment apart flip a node from busy to idle and back: it keeps the connections
    its first burst opened (no connection set-up on the hot path at every flip, and no closed backend lingering
    beside a new one); idle for longer than store.KEEP, it is back to one for statements and one to LISTEN."""
    with Farm(pg_url, client="queueprocessor n0") as farm, Farm(pg_url) as observer:
        opened = []
        event.listen(farm._engine, "connect", lambda *_: opened.append(1))
        nodes = Nodes(farm)
        try:
            nodes("n0", capacity=4)
            for burst in range(1, 5):
                observer.enqueue(observer.python_spec(f"{PYJOBS}:nap", 0.01), count=40)
                wait_for(lambda: observer.job_counts().get("succeeded", 0) == 40 * burst)
                if burst == 1:
                    first = len(opened)
                time.sleep(0.5)  # idle, for less than KEEP
            assert len(opened) == first, f"{len(opened) - first} connections opened after the first burst"
            wait_for(lambda: per_node(pg_url)["queueprocessor n0"] == IDLE, timeout=KEEP + 5)
        finally:
            nodes.stop_all()


@pytest.mark.postgres
def test_every_connection_of_a_node_carries_its_machine_name(pg_url, processes):
    with Farm(pg_url) as farm:
        processes.append(
            subprocess.Popen(
                [*QP, "--db", pg_url, "node", "--name", "web 3", "--allow-command", "sleep"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        wait_for(lambda: active(farm, "web 3"), 30)
        farm.enqueue(farm.command_spec(["sleep", "0.3"]), count=12)  # claims and results: every connection
        seen = set()
        wait_for(lambda: seen.update(sessions(pg_url)) or farm.job_counts().get("succeeded") == 12, 30)
    assert seen == {"queueprocessor web 3", client_name()}  # the node's; this test's Farm, by host name


@pytest.mark.postgres
def test_the_apps_connections_carry_gui_and_its_machine_name(pg_url, processes, tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path), QP_DB=pg_url)
    with Farm(pg_url) as farm:
        app = subprocess.Popen(
            [*QP, "gui", "--name", "desk-1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        processes.append(app)
        wait_for(lambda: active(farm, "desk-1"), 30)
        names = set(sessions(pg_url)) - {client_name()}
        app.send_signal(signal.SIGTERM)
        assert app.wait(30) == 0
    assert names == {"queueprocessor-gui desk-1"}


@pytest.mark.parametrize(
    "url",
    [
        "mssql+pyodbc://qp:pw@db/farm?driver=ODBC+Driver+18+for+SQL+Server",
        "mssql+pyodbc:///?odbc_connect=DRIVER%3D%7BODBC+Driver+18%7D%3BSERVER%3Ddb%3BUID%3Dqp%3BPWD%3Dpw",
    ],
)
def test_sql_server_connections_carry_the_name_as_app(url):
    """No server here: the connection string pyodbc would be given is checked."""
    engine = open_engine(url, client="queueprocessor rack;7")
    [connection_string], _ = engine.dialect.create_connect_args(engine.url)
    assert connection_string.count("APP=") == 1 and ";APP={queueprocessor rack;7}" in connection_string


def test_a_name_the_url_gives_is_kept():
    engine = open_engine("postgresql://qp:pw@db/farm?application_name=billing", client="queueprocessor web-3")
    assert engine.url.query["application_name"] == "billing"


@pytest.mark.postgres
def test_a_pooled_connection_the_server_closed_is_replaced_when_taken_and_a_live_one_is_kept(pg_url):
    """No ping per checkout (store.connections.closing): a live pooled connection is handed out as it is, and
    one whose server process was ended (a restart, a failover, an administrator) is found closed and replaced,
    so the statement that takes it does not fail."""
    with Farm(pg_url) as farm:
        backend = farm._store.rows(select(func.pg_backend_pid()))[0][0]
        assert farm._store.rows(select(func.pg_backend_pid()))[0][0] == backend, "the live one is kept"
        parts = make_url(pg_url)
        with psycopg.connect(
            host=parts.host,
            port=parts.port,
            user=parts.username,
            password=parts.password,
            dbname=parts.database,
            autocommit=True,
        ) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
            wait_for(lambda: not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)).fetchall())
        replaced = farm._store.rows(select(func.pg_backend_pid()))[0][0]
        assert replaced != backend


@pytest.mark.postgres
def test_a_node_working_off_a_backlog_keeps_its_connections(pg_url, processes):
    """Fast jobs leave a draining node without a job for a moment between two claims: it keeps the connection
    for its results all the same (store.Held), rather than give it back and open a new one for the next claim (a
    new server process each time, which parses and plans every statement afresh)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    processes.append(
        subprocess.Popen(
            [*QP, "--db", pg_url, "node", "--name", "n0", "--capacity", "16", "--allow-module", PYJOBS],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    parts = make_url(pg_url)
    with (
        Farm(pg_url) as farm,
        psycopg.connect(
            host=parts.host,
            port=parts.port,
            user=parts.username,
            password=parts.password,
            dbname=parts.database,
            autocommit=True,
        ) as observer,
    ):

        def opened() -> int:  # sessions the server opened on the farm's database so far
            return observer.execute(
                "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()[0]

        wait_for(lambda: active(farm, "n0"), 60)
        wait_for(lambda: idle(pg_url, 1), 30)
        observer.execute("SELECT pg_stat_force_next_flush()")  # its own session counted now, not in the drain
        before = opened()
        farm.enqueue(farm.python_spec(f"{PYJOBS}:echo_async", None), count=2000)
        wait_for(lambda: farm.job_counts()["succeeded"] == 2000, 60)
        # At most its second connection (its claims' while the first is kept for results), and a stray one.
        assert opened() - before <= 2, f"the node opened {opened() - before} connections to drain the backlog"
        wait_for(lambda: idle(pg_url, 1), 30)  # and gives the first back once idle
