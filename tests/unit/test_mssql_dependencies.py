"""SQL Server: the statements of dependencies and groups compile to T-SQL (no server runs here; the contract suite
runs them on a real one when QP_TEST_MSSQL_URL is set). Each is compiled with the real mssql+pyodbc dialect by a
connection that answers with scripted rows, so every branch of a release, a cascade and a restore is reached."""

from sqlalchemy.dialects.mssql import pyodbc

from queueprocessor.rules.job import Claimed, Ending, JobSpec
from queueprocessor.store import dependencies
from queueprocessor.store.runs import _write_endings


class Rows(list):
    @property
    def rowcount(self):
        return len(self)

    def all(self):
        return list(self)

    def scalar(self):
        return self[0][0] if self else None


class Scripted:
    """A connection that compiles what it is given for SQL Server and answers each statement with the next rows."""

    dialect = pyodbc.dialect()

    def __init__(self, *answers):
        self.answers = list(answers)
        self.sql: list[str] = []

    def execute(self, statement, params=None):
        self.sql.append(" ".join(str(statement.compile(dialect=self.dialect)).split()))
        return Rows(self.answers.pop(0) if self.answers else [])


def sets(sql: str, assignment: str) -> bool:
    """`sql` is an update of qp_jobs with `assignment` among its SET clauses (in the table's column order)."""
    return sql.startswith("UPDATE qp_jobs SET ") and (f"SET {assignment}" in sql or f", {assignment}" in sql)


def test_an_enqueue_after_parents_locks_them_and_links_the_child():
    conn = Scripted([(1, "succeeded"), (2, "failed")])
    spec = JobSpec("http", "/ok", after=(1, 2))
    row, failed = dependencies.start(conn, spec)
    assert (row, failed) == ({"state": "waiting", "pending": 1}, (2, "failed"))
    conn.answers = [[], [(5,)]]
    dependencies.linked(conn, [5], spec, failed)
    lock, links, cancel, *_ = conn.sql
    assert lock.startswith("UPDATE qp_jobs SET has_children=") and "OUTPUT inserted.id, inserted.state" in lock
    assert links.startswith("INSERT INTO qp_deps")
    assert sets(cancel, "state=") and "OUTPUT inserted.id" in cancel
    assert "SYSUTCDATETIME()" in cancel


def test_a_parents_finish_releases_and_cancels_in_t_sql():
    job = Claimed(1, "http", "/ok", "GET", None, 1, 1, None, 3, 0.0)
    conn = Scripted([(1,)], [], [], [(7, "queued")], [], [], [(8, 2)], [(8,)], [], [])
    assert _write_endings(conn, 9, [Ending(job, "succeeded")], parents=True) == ["succeeded"]
    dependencies.ended(conn, [(2, "failed")])
    finish, *rest = conn.sql
    assert "qp_jobs.has_children = 1" in finish and "qp_jobs.fence = " in finish
    release = next(s for s in rest if sets(s, "state=CASE WHEN (qp_jobs.pending - (SELECT"))
    assert "OUTPUT inserted.id, inserted.state" in release and "qp_jobs.state = 'waiting'" in release
    assert "RETURNING" not in " ".join(conn.sql)
    assert any(s.startswith("SELECT qp_flows.id, qp_flows.callback_id") for s in rest)
    assert any("qp_deps.after_ended = 0" in s for s in rest), "the cascade follows the edges that are not after_ended"


def test_a_retry_restores_in_t_sql():
    conn = Scripted([(8,)], [(8,)], [(2,), (3,)], [], [(8, 3, "failed")], [(8,)], [], [])
    dependencies.restore(conn, 2)
    restore, lock, parents, recount, failed, *_ = conn.sql
    assert sets(restore, "state=") and "qp_jobs.held_by = " in restore
    assert "qp_jobs WITH (UPDLOCK, ROWLOCK)" in lock, "the jobs to count again are locked first"
    assert "qp_jobs WITH (UPDLOCK, ROWLOCK)" in parents and "qp_deps.parent_id" in parents, "then their parents"
    assert recount.startswith("UPDATE qp_jobs SET pending=coalesce((SELECT count(*)")


def test_a_retried_child_waits_again_and_a_cancel_asked_is_kept_in_t_sql():
    conn = Scripted([(8,)], [(2,)], [(8, "waiting")], [(8, 2, "failed")], [(8,)], [], [])
    assert dependencies.rejoined(conn, [8]) == {8: (2, "parent 2 failed")}
    linked, parents, wait, failed, cancel, *_ = conn.sql
    assert linked.startswith("SELECT DISTINCT qp_deps.child_id")
    assert "qp_jobs WITH (UPDLOCK, ROWLOCK)" in parents, "the parents are locked before they are counted"
    assert sets(wait, "state=CASE WHEN (coalesce((SELECT count(*)")
    assert "OUTPUT inserted.id" in wait
    assert "qp_jobs.held_by" not in failed and sets(cancel, "state=")
    job = Claimed(1, "http", "/ok", "GET", None, 1, 3, None, 3, 0.0)
    conn = Scripted([(1,)], [(1, "cancelled")], [], [], [(1, "cancelled")], [], [], [])
    assert _write_endings(conn, 9, [Ending(job, "failed", "x", 0.0)], parents=True) == ["cancelled"]
    again = conn.sql[0]
    assert sets(again, "state=CASE WHEN (qp_jobs.cancel_requested = 1)")
    assert "RETURNING" not in " ".join(conn.sql)


def test_a_callback_after_thousands_of_members_flags_them_within_sql_servers_parameter_limit():
    conn = Scripted(*([(n, "queued") for n in range(first, min(first + 1000, 2500))] for first in (0, 1000, 2000)))
    row, failed = dependencies.start(conn, JobSpec("http", "/ok", after=tuple(range(2500)), after_ended=True))
    assert (row, failed) == ({"state": "waiting", "pending": 2500}, None)
    assert len(conn.sql) == 3
