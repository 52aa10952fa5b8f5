"""SQL Server is the seeds' database: the hot statements must compile to valid T-SQL.

No server runs here, so the statements are captured and compiled with the real
mssql+pyodbc dialect; the contract suite runs against a real server whenever
QP_TEST_MSSQL_URL is set (see conftest.py).
"""

import contextlib

import pytest
from sqlalchemy.dialects.mssql import pyodbc
from sqlalchemy.schema import CreateIndex, CreateTable

from queueprocessor import schema
from queueprocessor.store import Store


@pytest.fixture
def captured():
    """A store whose statements are compiled for SQL Server instead of executed."""
    store = Store.__new__(Store)
    store.dialect = "mssql"
    sql: list[str] = []

    def compile_only(statement, params=None):
        sql.append(str(statement.compile(dialect=pyodbc.dialect(), compile_kwargs={"literal_binds": False})))
        return []

    store._one = compile_only
    return store, sql


def test_claim_uses_readpast_and_output(captured):
    store, sql = captured
    store.claim(7, 4, lease=3.0)
    [claim] = sql
    assert "WITH (UPDLOCK, ROWLOCK, READPAST)" in claim
    assert "TOP __[POSTCOMPILE_param_1]" in claim or "TOP" in claim
    assert "OUTPUT inserted.id" in claim
    assert "SYSUTCDATETIME()" in claim
    assert "qp_jobs.fence + " in claim  # the fence moves on with every claim


def test_turn_heartbeat_and_renewal_compile(captured):
    store, sql = captured
    store.take_turn(123, 7)
    store.heartbeat(7, state="active", applied_wish="pause", running=0, done=0, failed=0, offset=0.0,
                    rtt=0.001, error_bound=0.0005)
    store.renew(7, [(1, 2), (3, 4)], lease=3.0)
    with contextlib.suppress(IndexError):  # compiled, not run: no rows come back
        store.read_machines(backlog_since=100)
    turn, beat, renew, read = sql[:4]
    assert turn.startswith("INSERT INTO qp_turns") and "SYSUTCDATETIME()" in turn
    assert "UPDATE qp_machines SET" in beat and "CASE WHEN" in beat
    assert "qp_jobs.owner = :" in renew and "qp_jobs.fence = :" in renew and "OUTPUT inserted.id" in renew
    assert "max(qp_turns.slot)" in read


def test_schema_compiles_with_a_filtered_unique_key():
    dialect = pyodbc.dialect()
    for table in schema.metadata.sorted_tables:
        assert "CREATE TABLE" in str(CreateTable(table).compile(dialect=dialect))
    [key_index] = [i for i in schema.jobs.indexes if i.name == "ux_qp_jobs_key"]
    ddl = str(CreateIndex(key_index).compile(dialect=dialect))
    assert "UNIQUE" in ddl and "WHERE [key] IS NOT NULL" in ddl
