"""SQL Server is the seeds' database: the hot statements must compile to valid T-SQL.

No server runs here, so the statements are captured and compiled with the real
mssql+pyodbc dialect; the contract suite runs against a real server whenever
QP_TEST_MSSQL_URL is set (see conftest.py).
"""

import contextlib

import pytest
from sqlalchemy.dialects.mssql import pyodbc
from sqlalchemy.schema import CreateIndex, CreateTable

from queueprocessor.rules.job import JobSpec
from queueprocessor.rules.limits import MAX_ATTEMPTS
from queueprocessor.store import schema
from queueprocessor.store.inserts import job_row
from queueprocessor.store.jobs import JobStore
from queueprocessor.store.machines import MachineStore
from queueprocessor.store.roster import RosterStore
from queueprocessor.store.runs import RunStore
from queueprocessor.store.sqlfunctions import mssql_procedure
from queueprocessor.store.stores import Store
from queueprocessor.store.turns import TurnStore
from queueprocessor.store.types import ClaimRequest


@pytest.fixture
def captured():
    """A store whose statements are compiled for SQL Server instead of executed."""
    store = Store.__new__(Store)
    store.dialect, store.whole, store.tsql = "mssql", False, True
    store.actor = "tester pid 1"
    sql: list[str] = []

    class Matched(list):
        """No rows come back, and a write matched one row."""

        rowcount = 1

        def scalar_one(self):
            return "m"  # a machine's name, for the event a change logs

    class Compiler:
        """Stands in for the engine and its connection: a claim runs in a transaction of its own."""

        def begin(self):
            return contextlib.nullcontext(self)

        def execute(self, statement, params=None):
            compiled = statement.compile(dialect=pyodbc.dialect())
            sql.append(str(compiled))
            limits.extend(v for k, v in compiled.params.items() if k.startswith("param_"))
            return Matched()

    limits: list[int] = []
    store.engine = Compiler()
    store.rows = Compiler().execute
    store.count = lambda statement, params=None: Compiler().execute(statement, params).rowcount
    store.limits = limits
    store.turns = TurnStore(store)
    store.jobs, store.runs, store.machines = JobStore(store, store.turns), RunStore(store), MachineStore(store)
    return store, sql


@pytest.mark.parametrize("take_expired", [True, False])
@pytest.mark.parametrize("expired_before", [None, 1e9])
@pytest.mark.parametrize("limit", [1, 4])
@pytest.mark.parametrize("turn", [False, True])
def test_every_claim_a_node_makes_compiles_for_sql_server(captured, take_expired, expired_before, limit, turn):
    store, sql = captured
    options = dict(take_expired=take_expired, expired_before=expired_before)
    if turn:  # SQL Server records the turn first, then claims as Store.claim does
        store.jobs.take_turn_and_claim(123, ClaimRequest(7, limit, lease=3.0, **options))
        turn_sql, *leaving, claim = sql
        assert turn_sql.startswith("INSERT INTO qp_turns")
    else:
        store.jobs.claim(ClaimRequest(7, limit, lease=3.0, **options))
        *leaving, claim = sql
    # Taking expired leases over, the claim first reads (and locks) whose runs it will end as lost.
    assert [
        (s.startswith("SELECT qp_jobs.id, qp_jobs.owner, qp_jobs.started_at"), "WITH (UPDLOCK, ROWLOCK, READPAST)" in s)
        for s in leaving
    ] == ([(True, True)] if take_expired else [])
    branches = 2 if take_expired else 1  # queued jobs, and jobs whose lease ran out
    assert claim.startswith("UPDATE qp_jobs SET") and "OUTPUT inserted.id" in claim
    assert claim.count("WITH (UPDLOCK, ROWLOCK, READPAST)") == branches
    tops = claim.count("TOP __[POSTCOMPILE_")  # each branch, and the merge of two, takes TOP limit
    assert tops == (3 if take_expired else 1) and store.limits == [limit] * tops
    assert "ROW_NUMBER" not in claim  # a plain number: no numbering of every due row
    assert ("UNION ALL" in claim) == take_expired
    assert (":b_before" in claim) == (expired_before is not None)
    assert "SYSUTCDATETIME()" in claim
    assert "qp_jobs.fence + " in claim  # the fence moves on with every claim


def test_turn_heartbeat_and_renewal_compile(captured):
    store, sql = captured
    store.turns.take(123, 7)
    store.machines.heartbeat(
        7, state="active", applied_wish="pause", running=0, done=0, failed=0, offset=0.0, rtt=0.001, error_bound=0.0005
    )
    store.runs.renew(7, [(1, 2), (3, 4)], lease=3.0)
    with contextlib.suppress(IndexError):  # compiled, not run: no rows come back
        store.machines.read(backlog_since=100)
    turn, beat, renew, read = sql[:4]
    assert turn.startswith("INSERT INTO qp_turns") and "SYSUTCDATETIME()" in turn
    assert "UPDATE qp_machines SET" in beat and "CASE WHEN" in beat
    assert "qp_jobs.owner = :" in renew and "qp_jobs.fence = :" in renew and "OUTPUT inserted.id" in renew
    assert "max(qp_turns.slot)" in read


def test_the_roster_statements_compile(captured):
    store, sql = captured
    peers = RosterStore(store)
    with contextlib.suppress(IndexError):  # compiled, not run: no rows come back
        peers.read_farm(7, before=1e9, backlog_since=100)
    with contextlib.suppress(IndexError):
        peers.read_all()
    with contextlib.suppress(IndexError):
        peers.read_changes(40, 2)
    assert peers.bury(7, 1e9)
    heartbeat_read, read_all, read_changes, bury, bump, mark, _name, event = sql
    assert event.startswith("INSERT INTO qp_events") and "SYSUTCDATETIME()" in event, "the burial is logged with it"
    assert "qp_machines.id = :me AND qp_machines.wish IS NOT NULL" in heartbeat_read
    assert (
        "(SELECT min(qp_machines.last_seen) AS min_2 FROM qp_machines WHERE qp_machines.state IN ('active', "
        "'paused', 'draining')) < :before" in " ".join(heartbeat_read.split())
    )
    assert "qp_roster.version" in heartbeat_read and "qp_roster.version" in read_all
    assert "SET state=:state" in bury and "qp_machines.last_seen = :last_seen_1" in bury
    assert bump.startswith("UPDATE qp_roster SET version=(qp_roster.version + :version_1)")
    assert mark.startswith("UPDATE qp_machines SET changed=(SELECT qp_roster.version"), "the change on its row"
    assert "qp_machines.changed > :since" in read_changes and "ORDER BY qp_machines.changed" in read_changes
    assert "mssql_rn <= :most" in read_changes, "the first `most` changed, numbered (a bound TOP is not SQL Server's)"


def test_schema_compiles_with_a_filtered_unique_key():
    dialect = pyodbc.dialect()
    schema.partial_for("mssql")  # as database.ensure_schema does before a server builds the schema
    for table in schema.metadata.sorted_tables:
        assert "CREATE TABLE" in str(CreateTable(table).compile(dialect=dialect))
    [key_index] = [i for i in schema.jobs.indexes if i.name == "ux_qp_jobs_key"]
    ddl = str(CreateIndex(key_index).compile(dialect=dialect))
    assert "UNIQUE" in ddl and "WHERE [key] IS NOT NULL" in ddl


def test_qp_enqueue_is_a_procedure_with_the_functions_parameters_that_inserts_the_python_enqueues_row():
    """The seeds enqueue from T-SQL too: the procedure takes qp_enqueue's parameters (the same defaults), refuses bad
    input with THROW, and inserts every column the Python enqueue fills (inserts.job_row), returning the id."""
    procedure = mssql_procedure()
    assert procedure.startswith("CREATE OR ALTER PROCEDURE qp_enqueue")
    head = procedure.split("AS\nBEGIN")[0]
    for parameter in ("@executor", "@target", "@payload", "@queue", "@order_key", "@run_at"):
        assert parameter in head
    assert "@queue nvarchar(4000) = N'default'" in head and "@run_at datetimeoffset = NULL" in head
    assert procedure.count("THROW 51000, @problem, 1;") == 12
    [insert] = [line for line in procedure.splitlines() if line.strip().startswith("INSERT INTO qp_jobs")]
    filled = insert.split("(", 1)[1].split(")", 1)[0].replace("[key]", "key").split(", ")
    defaulted = {column.name for column in schema.jobs.c if column.default is not None}  # e.g. a dependency's flags
    assert set(filled) == {*job_row(JobSpec("http", "/x")), *defaulted, "created_at", "run_at", "gated", "vtag"}
    assert "OUTPUT inserted.id" in insert and f", {MAX_ATTEMPTS}, " in insert


def test_the_read_only_question_compiles_to_t_sql():
    """permissions asks SQL Server what the user may write with HAS_PERMS_BY_NAME, over every farm table."""
    from queueprocessor.store.permissions import _MSSQL_ASK

    tables = sorted(schema.metadata.tables)
    compiled = _MSSQL_ASK.bindparams(tables=tables).compile(
        dialect=pyodbc.dialect(), compile_kwargs={"render_postcompile": True}
    )
    sql = str(compiled)
    assert sql.count("HAS_PERMS_BY_NAME(") == 3 and "USER_NAME()" in sql
    assert sql.count(":tables_") == len(tables) and "sys.tables" in sql, sql
