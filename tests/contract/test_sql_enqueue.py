"""qp_enqueue: the database's own door to the queue, on PostgreSQL (and SQL Server when one is reachable: see
conftest). It enqueues in its caller's transaction, refuses what the Python enqueue refuses with one error that says
what to do, fills the row as the Python enqueue fills it, and wakes the farm through push."""

import datetime
import os

import psycopg
import pytest
from sqlalchemy import create_engine, exc, text
from sqlalchemy.engine import make_url

from queueprocessor import Farm
from queueprocessor.rules.job import JobSpec
from queueprocessor.store import schema
from queueprocessor.store.sqlfunctions import SIGNATURE
from tests.conftest import backend_url

# The grant docs/sql-enqueue.md gives a role that is to enqueue and do nothing else.
GRANTS = [f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO esb_writer"]

SQL_BACKENDS = [pytest.param("postgresql", marks=pytest.mark.postgres)]
if os.environ.get("QP_TEST_MSSQL_URL"):
    SQL_BACKENDS.append("mssql")


@pytest.fixture(params=SQL_BACKENDS)
def farm(request, tmp_path):
    with Farm(backend_url(request, tmp_path)) as the_farm:
        yield the_farm


def call(conn, executor, target, **given):
    """qp_enqueue with the arguments given (the rest left to its defaults), as a trigger or a client calls it."""
    if conn.dialect.name == "postgresql":
        casts = {"payload": "CAST(:payload AS jsonb)", "run_at": "CAST(:run_at AS timestamptz)"}
        named = "".join(f", {name} => {casts.get(name, ':' + name)}" for name in given)
        statement = f"SELECT qp_enqueue(:executor, :target{named})"
    else:
        statement = "EXEC qp_enqueue @executor = :executor, @target = :target" + "".join(
            f", @{name} = :{name}" for name in given
        )
    return conn.execute(text(statement), dict(executor=executor, target=target, **given)).scalar_one()


def test_it_enqueues_in_the_callers_transaction(farm):
    engine = farm._engine
    with engine.connect() as conn:
        with conn.begin() as transaction:
            kept = call(conn, "http", "/reports/daily")
            assert farm._store.jobs.newest(None, 10) == []  # not committed: nobody else sees it
        with conn.begin() as transaction:
            dropped = call(conn, "http", "/reports/never")
            transaction.rollback()
    assert [job["id"] for job in farm._store.jobs.newest(None, 10)] == [kept]
    assert dropped != kept


def test_its_row_is_the_python_enqueues_row(farm):
    """Every column the Python enqueue fills, filled alike (the defaults come from the same place), but the id, the
    times, and who signed it."""
    [python] = farm._store.jobs.enqueue(
        JobSpec(executor="python", target="app.jobs:index", payload='{"row":7}', queue="reports", order_key="r-1")
    )
    farm.set_queue("reports", limit=2)  # a held-back queue's new job is gated, as any enqueue gates it
    with farm._engine.begin() as conn:
        sql = call(conn, "python", "app.jobs:index", payload='{"row": 7}', queue="reports", order_key="r-1")
    rows = {job["id"]: job for job in farm._store.jobs.newest(None, 10)}
    differ = {"id", "created_at", "run_at", "origin", "payload"}
    assert {k: v for k, v in rows[sql].items() if k not in differ} == {
        k: v for k, v in rows[python].items() if k not in differ
    }
    assert rows[sql]["gated"] and rows[sql]["max_attempts"] == JobSpec("python", "x:y").max_attempts
    assert rows[sql]["origin"].startswith("sql ")
    assert rows[sql]["run_at"] == pytest.approx(rows[sql]["created_at"], abs=0.01)  # due now: no run_at given


def test_run_at_is_kept_in_database_time(farm):
    at = datetime.datetime(2031, 5, 1, 12, 30, tzinfo=datetime.UTC)
    with farm._engine.begin() as conn:
        job_id = call(conn, "http", "/later", run_at=at)
    assert farm.job(job_id)["run_at"] == pytest.approx(at.timestamp(), abs=0.001)


@pytest.mark.parametrize(
    "executor, target, given, said, hint",
    [
        ("ftp", "/x", {}, "unknown executor 'ftp'", "use one of http, python, command"),
        ("http", "", {}, "target is 1 to 2000 characters", "name the work"),
        ("http", "ftp://host/x", {}, "is neither a path", "an HTTP job's target is a path"),
        ("python", "app.jobs", {}, "is not of the form package.module:function", "public function"),
        ("python", "app.jobs:_secret", {}, "names a private attribute", "public function"),
        ("command", "backup --full", {}, "is not a JSON list of strings", '["backup", "--full"]'),
        ("command", '["backup", 7]', {}, "is not a JSON list of strings", '["backup", "--full"]'),
        ("http", "/x", {"queue": "no spaces"}, "not a queue name", "letters, digits"),
        ("http", "/x", {"order_key": ""}, "order key", "1 to 200 characters"),
        ("http", "/x", {"payload": '"' + "x" * 70_000 + '"'}, "byte limit", "store large data elsewhere"),
    ],
)
def test_bad_input_is_one_error_saying_what_to_do(farm, executor, target, given, said, hint):
    with farm._engine.connect() as conn:
        with pytest.raises(exc.DBAPIError) as raised:
            call(conn, executor, target, **given)
    error = raised.value.orig
    if isinstance(error, psycopg.Error):
        message, shown_hint = error.diag.message_primary, error.diag.message_hint
    else:
        message = shown_hint = str(error)
    assert message.startswith("qp_enqueue: ") and said in message
    assert hint in shown_hint
    assert farm._store.jobs.newest(None, 10) == []


def test_a_commit_wakes_the_farm_through_push(farm):
    """The insert fires the jobs table's trigger: a node listening on the jobs channel hears of the job once the
    caller commits, not before."""
    if farm._engine.dialect.name != "postgresql":
        pytest.skip("push is PostgreSQL's")
    dsn = make_url(farm.url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {schema.JOBS_CHANNEL}")
        with farm._engine.connect() as conn:
            with conn.begin():
                call(conn, "http", "/wake")
                assert list(listener.notifies(timeout=0.2)) == []
        heard = [n for n in listener.notifies(timeout=10, stop_after=1)]
    assert [n.channel for n in heard] == [schema.JOBS_CHANNEL]


@pytest.mark.postgres
def test_a_role_granted_only_the_door_can_enqueue_and_nothing_more(pg_url):
    """As docs/sql-enqueue.md grants it: the function alone (tests/contract/test_sql_enqueue_role.py tries more)."""
    with Farm(pg_url) as farm:
        with farm._engine.begin() as conn:
            conn.execute(text("DROP ROLE IF EXISTS esb_writer"))
            conn.execute(text("CREATE ROLE esb_writer LOGIN PASSWORD 'esb'"))
            for grant in GRANTS:
                conn.execute(text(grant))
        writer_url = make_url(pg_url).set(username="esb_writer", password="esb").render_as_string(False)
        engine = create_engine(writer_url)
        try:
            with engine.begin() as conn:
                job_id = call(conn, "http", "/from/esb")
            with engine.connect() as conn, pytest.raises(exc.ProgrammingError, match="permission denied"):
                conn.execute(text("UPDATE qp_jobs SET state = 'succeeded'"))
        finally:
            engine.dispose()
        assert farm.job(job_id)["origin"].startswith("sql esb_writer pid ")


@pytest.fixture
def pg_farm(pg_url):
    """qp_enqueue takes a key and its terms on PostgreSQL (SQL Server's procedure takes none yet)."""
    with Farm(pg_url) as the_farm:
        yield the_farm


def keyed(conn, payload, **given):
    casts = {"debounce": "CAST(:debounce AS interval)", "max_delay": "CAST(:max_delay AS interval)"}
    named = "".join(f", {name} => {casts.get(name, ':' + name)}" for name in given)
    statement = f"SELECT qp_enqueue('http', '/orders', CAST(:payload AS jsonb), key => :key{named})"
    return conn.execute(text(statement), dict(payload=payload, key="order-7", **given)).scalar_one()


def test_a_debounced_key_from_sql_moves_its_one_waiting_job_as_the_python_enqueue_does(pg_farm):
    with pg_farm._engine.begin() as conn:
        first = keyed(conn, '{"n": 1}', debounce="30 seconds", max_delay="45 seconds")
    due = pg_farm.job(first)["run_at"]
    with pg_farm._engine.begin() as conn:
        assert keyed(conn, '{"n": 2}', debounce="30 seconds", max_delay="45 seconds") == first
    spec = pg_farm.http_spec("/orders", payload='{"n": 3}', key="order-7", debounce=30, max_delay=45)
    assert pg_farm.submit(spec).ids == [first]  # the Python enqueue settles with the job SQL made, and back
    job = pg_farm.job(first)
    assert job["payload"] == '{"n":3}' and due < job["run_at"] <= job["created_at"] + 45
    assert job["key_scope"] == "waiting" and len(pg_farm._store.jobs.newest(None, 10)) == 1


def test_a_held_key_from_sql_answers_as_on_conflict_says(pg_farm):
    with pg_farm._engine.begin() as conn:
        first = keyed(conn, '{"n": 1}', key_scope="unfinished")
        assert keyed(conn, '{"n": 2}', on_conflict="existing") == first
        assert keyed(conn, '{"n": 3}', on_conflict="replace") == first
    assert pg_farm.job(first)["payload"] == '{"n": 3}'  # as PostgreSQL writes a jsonb as text
    with pg_farm._engine.connect() as conn, pytest.raises(exc.IntegrityError) as raised:
        keyed(conn, '{"n": 4}')
    assert raised.value.orig.diag.message_primary == f"qp_enqueue: key 'order-7' is held by job {first}"
    assert "on_conflict => 'existing'" in raised.value.orig.diag.message_hint


@pytest.mark.parametrize(
    "given, said",
    [
        (dict(key="singleton:feed"), "key 'singleton:feed' has the form of a schedule's occurrence"),
        (dict(key="daily@2026-12-06T18:00:00.000+00:00"), "has the form of a schedule's occurrence"),
        (dict(key_scope="waiting"), "a key's terms need a key"),
        (dict(key="k", key_scope="always"), "key_scope 'always' is none of kept, waiting, unfinished"),
        (dict(key="k", on_conflict="merge"), "on_conflict 'merge' is none of reject, existing, replace"),
        (dict(key="k", debounce="0 s"), "debounce 00:00:00 is not a positive time"),
        (dict(key="k", debounce="5 s", max_delay="1 s"), "needs a debounce no longer than it"),
        (dict(key="k", debounce="5 s", on_conflict="reject"), "debounce sets the job's time"),
    ],
)
def test_a_bad_key_or_terms_from_sql_is_one_error(pg_farm, given, said):
    casts = {"debounce": "CAST(:debounce AS interval)", "max_delay": "CAST(:max_delay AS interval)"}
    named = "".join(f", {name} => {casts.get(name, ':' + name)}" for name in given)
    with pg_farm._engine.connect() as conn, pytest.raises(exc.DBAPIError) as raised:
        conn.execute(text(f"SELECT qp_enqueue('http', '/x'{named})"), given)
    assert said in raised.value.orig.diag.message_primary
    assert pg_farm._store.jobs.newest(None, 10) == []
