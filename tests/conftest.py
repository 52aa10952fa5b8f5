"""Fixtures shared by the suite: one real PostgreSQL server per session, a fresh database per test,
and every contract test run against each backend (SQLite, PostgreSQL, and SQL Server when
QP_TEST_MSSQL_URL names a reachable server)."""

import os
import threading
import uuid

import pytest

from queueprocessor.farm import Farm
from queueprocessor.store import schema
from queueprocessor.store.database import open_engine
from tests.support.httptarget import HttpTarget
from tests.support.pgbouncer import PgBouncer
from tests.support.pgserver import PostgresServer

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
if os.environ.get("QP_TEST_MSSQL_URL"):
    BACKENDS.append("mssql")


@pytest.fixture(scope="session")
def pg_server():
    with PostgresServer() as server:
        yield server


@pytest.fixture
def pg_url(pg_server):
    """A fresh PostgreSQL database for one test."""
    return pg_server.create_database(f"t_{uuid.uuid4().hex[:12]}")


# PostgreSQL reached through PgBouncer in transaction pooling mode: the store contract suite runs on it too.
PGBOUNCER = pytest.param("pgbouncer", marks=pytest.mark.postgres)


@pytest.fixture(scope="session")
def pgbouncer(pg_server):
    with PgBouncer(pg_server) as bouncer:
        yield bouncer


@pytest.fixture
def bouncer_url(pg_url, pgbouncer):
    """A fresh PostgreSQL database for one test, reached through PgBouncer."""
    return pgbouncer.url_for(pg_url)


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path):
    """A fresh, empty farm database on each backend in turn."""
    return backend_url(request, tmp_path)


def backend_url(request, tmp_path) -> str:
    """db_url's, for a suite that parametrises its own backends (request.param)."""
    if request.param == "pgbouncer":
        return request.getfixturevalue("bouncer_url")
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'farm.db'}"
    if request.param == "mssql":  # one server database for every test: emptied of the farm's tables first
        url = os.environ["QP_TEST_MSSQL_URL"]
        engine = open_engine(url, pool_size=1)
        try:
            schema.metadata.drop_all(engine)
        finally:
            engine.dispose()
        return url
    return request.getfixturevalue("pg_url")


@pytest.fixture
def farm(db_url):
    """A connected farm; on teardown, checks that no connection was left checked out."""
    the_farm = Farm(db_url)
    yield the_farm
    the_farm._store.give_back()  # the connection kept for results while jobs may be running (store.Held)
    leaked = the_farm._engine.pool.checkedout()
    the_farm.close()
    assert leaked == 0, f"{leaked} database connections were not returned to the pool"


@pytest.fixture
def http_target():
    with HttpTarget() as target:
        yield target


@pytest.fixture(autouse=True)
def no_leaked_threads():
    """A test must stop every node thread it started (qp-*) and every Qt worker it made."""
    before = set(threading.enumerate())
    yield
    deadline = threading.Event()
    for _ in range(50):
        leaked = [t for t in threading.enumerate() if t not in before and t.is_alive() and t.name.startswith("qp-")]
        if not leaked:
            return
        deadline.wait(0.1)
    pytest.fail(f"threads left running: {[t.name for t in leaked]}")
