"""A role that may enqueue through qp_enqueue may do nothing more, on a real PostgreSQL with real login roles: it is
granted what docs/sql-enqueue.md grants (EXECUTE on the function, nothing of the farm's tables), enqueues a queued
job like any other, cannot write the jobs table itself (a running job with a far lease, a waiting job that is never
released, a key that squats on a schedule's or a singleton's), and cannot divert the function with objects of its
own; and a farm made before schema version 11 takes the insert from the roles it was granted to."""

import re

import pytest
from sqlalchemy import create_engine, exc, text
from sqlalchemy.engine import make_url

from queueprocessor import Farm
from queueprocessor.store.database import open_engine
from queueprocessor.store.sqlfunctions import FORMER_SIGNATURE, SIGNATURE
from tests.acceptance.test_read_only_operators import OPERATOR_GRANTS, role_url
from tests.contract.test_migrations import make_version_10
from tests.support.work import ROOT

pytestmark = pytest.mark.postgres


def forged(**columns: str) -> str:
    """An insert of a whole job row (every column that has no default of the table's own), as `columns` set it."""
    row = dict(executor="'http'", target="'/squat'", method="'GET'", state="'queued'", priority="0", run_at="0")
    row |= dict(created_at="0", attempts="0", max_attempts="3", fence="0", cancel_requested="false", kind="'job'")
    row |= columns
    return f"INSERT INTO qp_jobs ({', '.join(row)}) VALUES ({', '.join(row.values())})"


# Writes a role that may only enqueue must not make, each refused for want of a privilege on the table.
FORGED = {
    "a running job whose lease never ends": forged(state="'running'", lease_until="1e12", owner="1", fence="1"),
    "a waiting job never released": forged(state="'waiting'", pending="1"),
    "a key that squats on a singleton's": forged(key="'singleton:nightly'", kind="'singleton'", run_at="1e12"),
    "a change of a job": "UPDATE qp_jobs SET state = 'running', lease_until = 1e12",
    "a deletion": "DELETE FROM qp_jobs",
}
DOOR = "qp_enqueue(executor => 'http', target => '/from/esb')"


def documented_grants() -> list[str]:
    """The GRANTs docs/sql-enqueue.md gives the role `esb_writer`, for any role (a GRANT may run over two lines)."""
    page = (ROOT / "docs" / "sql-enqueue.md").read_text()
    return [" ".join(g.replace("esb_writer", "{role}").split()) for g in re.findall(r"^ *(GRANT [^;]*);", page, re.M)]


def as_role(url: str, *statements: str) -> list[object]:
    """The statements run in one transaction on a fresh session of the role; what each returned (its first column,
    or how many rows it wrote)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            results = [conn.execute(text(statement)) for statement in statements]
            return [result.scalar() if result.returns_rows else result.rowcount for result in results]
    finally:
        engine.dispose()


def refused(url: str, statement: str) -> str:
    """The SQLSTATE of the database's refusal of `statement` by the role."""
    with pytest.raises(exc.DBAPIError) as raised:
        as_role(url, statement)
    return raised.value.orig.sqlstate  # type: ignore[union-attr]


def as_owner(url: str, *statements: str) -> None:
    engine = open_engine(url, pool_size=1)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()


def test_the_documented_grant_is_the_door_alone():
    assert documented_grants() == [f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {{role}}"]


def test_a_role_granted_the_door_enqueues_and_writes_nothing_else(pg_url):
    with Farm(pg_url) as farm:
        writer = role_url(pg_url, documented_grants())
        [job_id] = as_role(writer, f"SELECT {DOOR}")
        job = farm.job(job_id)
        assert job is not None
        assert (job["state"], job["lease_until"], job["owner"], job["key"], job["kind"], job["pending"]) == (
            "queued",
            None,
            None,
            None,
            "job",
            0,
        )
        assert job["origin"].startswith(f"sql {make_url(writer).username} pid ")
        for what, statement in FORGED.items():
            assert refused(writer, statement) == "42501", what  # insufficient_privilege
        # The door names nothing a row could squat with: its parameters are the six of an enqueue, a key with its
        # terms and a traceparent, and a key of the farm's own (a schedule's occurrence, a singleton's) is refused.
        with farm._engine.connect() as conn:
            names = conn.execute(text(f"SELECT proargnames FROM pg_proc WHERE oid = '{SIGNATURE}'::regprocedure"))
            assert names.scalar() == [
                *("executor", "target", "payload", "queue", "order_key", "run_at"),
                *("key", "key_scope", "key_until", "key_for", "on_conflict", "debounce", "max_delay"),
                "traceparent",
            ]
        squat = "qp_enqueue(executor => 'http', target => '/x', key => 'singleton:feed')"
        assert refused(writer, f"SELECT {squat}") == "22023"  # invalid_parameter_value
        assert [job["id"] for job in farm._store.jobs.newest(None, 10)] == [job_id]
        # A role not granted the door may not call it (PUBLIC may not).
        assert refused(role_url(pg_url, []), f"SELECT {DOOR}") == "42501"


def test_a_callers_own_objects_do_not_divert_the_door(pg_url):
    """The role owns a schema first in its search_path holding a same-named table of jobs and queues and a function
    the door calls (length(text)), and a temporary table of jobs (pg_temp is searched first for tables): the job
    lands in the farm's table, and nothing of the role's is read, written or run."""
    with Farm(pg_url) as farm:
        writer = role_url(pg_url, documented_grants())
        role = make_url(writer).username
        as_owner(
            pg_url,
            f"CREATE SCHEMA evil AUTHORIZATION {role}",
            "CREATE TABLE evil.qp_jobs (LIKE public.qp_jobs INCLUDING ALL)",
            "CREATE TABLE evil.qp_queues (LIKE public.qp_queues INCLUDING ALL)",
            f"ALTER TABLE evil.qp_jobs OWNER TO {role}",
            f"ALTER TABLE evil.qp_queues OWNER TO {role}",
        )
        engine = create_engine(writer)
        try:
            with engine.begin() as conn:
                for statement in (
                    "CREATE TABLE evil.diverted (who text)",
                    "GRANT INSERT ON evil.diverted TO PUBLIC",
                    "CREATE FUNCTION evil.length(text) RETURNS integer LANGUAGE sql "
                    "AS 'INSERT INTO evil.diverted VALUES (current_user) RETURNING 1'",
                    "CREATE TEMP TABLE qp_jobs (LIKE evil.qp_jobs INCLUDING ALL)",
                    "SET search_path = evil, pg_catalog, public",
                ):
                    conn.execute(text(statement))
                job_id = conn.execute(text(f"SELECT public.{DOOR}")).scalar_one()
                assert conn.execute(text("SELECT length('probe')")).scalar() == 1  # the role's own calls are diverted
                conn.execute(text("DELETE FROM evil.diverted"))
                left = [
                    conn.execute(text(f"SELECT count(*) FROM {table}")).scalar()
                    for table in ("pg_temp.qp_jobs", "evil.qp_jobs", "evil.diverted")
                ]
        finally:
            engine.dispose()
        assert left == [0, 0, 0]
        job = farm.job(job_id)
        assert job is not None and job["target"] == "/from/esb"


def test_a_farm_before_version_11_takes_the_insert_from_its_enqueuers_and_keeps_their_door(pg_url):
    """Made as version 10 left it (the door ran with its caller's rights, and PUBLIC could call it) with a role
    granted what its docs said, one that relied on PUBLIC for the door, and an operator: the upgrade leaves both
    writers the door alone, and the operator its writes."""
    make_version_10(pg_url)
    as_owner(
        pg_url,
        f"ALTER FUNCTION {FORMER_SIGNATURE} SECURITY INVOKER RESET search_path",
        f"GRANT EXECUTE ON FUNCTION {FORMER_SIGNATURE} TO PUBLIC",
    )
    version_10_grants = [
        "GRANT INSERT, SELECT (id) ON qp_jobs TO {role}",
        "GRANT USAGE ON SEQUENCE qp_jobs_id_seq TO {role}",
        "GRANT SELECT ON qp_queues TO {role}",
    ]
    writer = role_url(pg_url, [f"GRANT EXECUTE ON FUNCTION {FORMER_SIGNATURE} TO {{role}}", *version_10_grants])
    relying = role_url(pg_url, version_10_grants)
    operator = role_url(pg_url, OPERATOR_GRANTS)
    assert as_role(writer, FORGED["a running job whose lease never ends"]) == [1]  # as version 10 allowed
    with Farm(pg_url) as farm:  # the upgrade
        for role in (writer, relying):
            assert refused(role, FORGED["a running job whose lease never ends"]) == "42501"
            [job_id] = as_role(role, f"SELECT {DOOR}")
            assert farm.job(job_id)["state"] == "queued"
        assert as_role(operator, "SELECT has_table_privilege('qp_jobs', 'INSERT')") == [True]
        with farm._engine.connect() as conn:
            secured = conn.execute(
                text(f"SELECT prosecdef, proconfig FROM pg_proc WHERE oid = '{SIGNATURE}'::regprocedure")
            )
            assert secured.one() == (True, ["search_path=pg_catalog, pg_temp"])
