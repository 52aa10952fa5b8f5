"""The door the database itself enqueues through (docs/sql-enqueue.md): `qp_enqueue(executor, target, payload,
queue, order_key, run_at)`, a PL/pgSQL function on PostgreSQL and a procedure of the same name on SQL Server, for a
trigger or any SQL client to enqueue in its own transaction. (SQLite has no stored code: enqueue from Python.)

It checks what the Python enqueue checks of a job's form and the farm's bounds (a known executor, the target's form,
the queue's name, the order key, the payload's size, the time), each refusal one error with a hint, and inserts the
row the Python enqueue inserts: the statement is generated from the same row (inserts.job_row), the same default of
every column (JobSpec's), the same database time (dbtime) and queue gate (statements.gated_now). The insert fires
the jobs table's NOTIFY trigger, so on PostgreSQL it wakes the farm through push once the caller commits.

It is the only door a role that may enqueue needs, and it opens onto nothing more: it runs with its owner's rights
(SECURITY DEFINER on PostgreSQL, ownership chaining on SQL Server), so such a role is granted EXECUTE on it and
nothing of the farm's tables; and its parameters name none of what a row could be made to squat with (a state, a
lease, an owner, parents to wait for, a unique key, a kind): its job is a queued job like any other. On PostgreSQL
its search_path is pinned to pg_catalog and pg_temp, last, and the farm's tables are named with their schema, so a
caller's own objects (a same-named function or table in a schema of its own, or a temporary table) cannot divert it
(PostgreSQL's "Writing SECURITY DEFINER Functions Safely"); and PUBLIC may not execute it, only the roles granted.

What it cannot check is what the Python enqueue checks against the live machines' allow-lists: that needs the
machines judged alive in Python (Farm.check_allowed). A node refuses at run time, with the reason, any work its own
allow-lists do not admit; such a job fails that one run and never runs anywhere.
"""

from collections.abc import Callable
from typing import Any

from sqlalchemy import DDL, ColumnDefault, Float, String, func, insert, literal_column, text
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement

from ..rules.job import JobSpec
from ..rules.kinds import KINDS, TARGETS_SAID, WorkKind
from ..rules.limits import LATEST, MAX_PAYLOAD
from ..rules.queues import _NAME, _NAME_RULE, DEFAULT, MAX_NAME, MAX_ORDER_KEY
from .dbtime import db_now
from .inserts import job_row
from .schema import jobs
from .sql.ddl import farm_schema, run
from .sql.fair import key_of, tag
from .sql.gates import gated_now
from .sql.push import push_ddl

# What each refusal says to do, as the Python enqueue's errors say it (a malformed target: as its kind's row says).
HINTS = {
    "executor": f"use one of {', '.join(KINDS)}",
    "target": f"name the work: {TARGETS_SAID}",
    **{kind.name: kind.hint for kind in KINDS.values()},
    "queue": _NAME_RULE,
    "order_key": f"an order key is 1 to {MAX_ORDER_KEY} characters, or NULL",
    "payload": "store large data elsewhere and pass a reference",
    "run_at": "a time from 1970 to 9999, or NULL for now",
}
# Its signature, as GRANT and REVOKE name it on PostgreSQL.
SIGNATURE = "qp_enqueue(text, text, jsonb, text, text, timestamptz)"
TARGET_LENGTH = jobs.c.target.type.length  # type: ignore[attr-defined]
ORIGIN_LENGTH = jobs.c.origin.type.length  # type: ignore[attr-defined]


def create_sql_functions(conn: Connection) -> None:
    """(Re)create qp_enqueue on a PostgreSQL or SQL Server farm database, in the caller's transaction (a grant of
    EXECUTE already made is kept), and on PostgreSQL the coalesced push its commits wake the farm by (sql/push.py).
    On PostgreSQL it names the farm's tables in the schema they were made in: the first of the creating session's
    search_path, as create_all made them."""
    if conn.dialect.name == "postgresql":
        schema = farm_schema(conn)
        run(conn, push_ddl(schema))
        made = postgresql_function(schema)
    elif conn.dialect.name == "mssql":
        made = mssql_procedure()
    else:
        return
    run(conn, made)


# The roles a farm before schema version 11 let enqueue through qp_enqueue by the grants docs/sql-enqueue.md gave
# then: INSERT on qp_jobs (the function ran with its caller's rights) without UPDATE (which no enqueue needs, and
# every operator and node has). Only grants made directly on the table are found, as only they can be revoked so.
_PG_ENQUEUERS = text(
    "SELECT DISTINCT CAST(a.grantee AS regrole)::text FROM pg_class c, aclexplode(c.relacl) AS a "
    "WHERE c.oid = CAST('qp_jobs' AS regclass) AND a.privilege_type = 'INSERT' AND a.grantee NOT IN (0, c.relowner) "
    "AND NOT has_table_privilege(a.grantee, c.oid, 'UPDATE')"
)


def narrow_enqueuers(conn: Connection) -> list[str]:
    """PostgreSQL: the roles granted the insert qp_enqueue needed when it ran with its caller's rights keep the door
    and lose the insert (EXECUTE granted, INSERT on qp_jobs revoked); their names."""
    if conn.dialect.name != "postgresql":
        return []
    roles = list(conn.execute(_PG_ENQUEUERS).scalars())
    for role in roles:  # the database's own names (regrole's text is quoted where it must be), never input
        conn.execute(DDL(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {role}"))
        conn.execute(DDL(f"REVOKE INSERT ON qp_jobs FROM {role}"))
    return roles


def _insert(dialect: Any, value: Callable[[str], ColumnElement[Any]], farm_schema: str | None = None) -> str:
    """The Python enqueue's insert of one job (JobStore.enqueue), its given columns read through `value` (a variable
    of the stored code), every other column as a default JobSpec fills it; returning the new id. With `farm_schema`,
    every table is named in it."""
    row = job_row(JobSpec(executor="", target=""))
    given = {name: value(name) for name in ("executor", "target", "payload", "queue", "order_key", "origin")}
    # Columns with a default of the schema's own (e.g. a dependency's flags): compiled with literal binds, a Python-side
    # default would be written NULL, so each is given as its value.
    defaults = {c.name: c.default.arg for c in jobs.c if isinstance(c.default, ColumnDefault) and c.default.is_scalar}
    statement = (
        insert(jobs)
        .values(
            defaults
            | row
            | given
            | dict(
                created_at=db_now(),
                run_at=func.coalesce(value("run_at"), db_now()),  # none given: due now
                gated=gated_now(value("queue")),
                fair_key=(fair_key := key_of(dialect.name, value("queue"), value("order_key"), value("payload"), True)),
                vtag=tag(value("queue"), fair_key, maybe_null=True),  # in a fair queue, a turn of its key
            )
        )
        .returning(jobs.c.id)
    )
    translated: dict[str, Any] = (
        {"schema_translate_map": {None: farm_schema}, "render_schema_translate": True} if farm_schema else {}
    )
    return str(statement.compile(dialect=dialect, compile_kwargs={"literal_binds": True}, **translated))


# The function's variables, named for the columns they fill (names, never values, in its text).
_VARIABLES = {name: "v_" + name for name in ("executor", "target", "payload", "queue", "order_key", "origin", "run_at")}


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def postgresql_function(farm_schema: str) -> str:
    """CREATE OR REPLACE FUNCTION qp_enqueue(...) RETURNS bigint: the job's id; it runs with its owner's rights on
    the tables of `farm_schema`, and only the roles granted EXECUTE may call it."""
    from sqlalchemy.dialects import postgresql

    dialect = postgresql.dialect()
    insert_sql = _insert(
        dialect, lambda name: literal_column(_VARIABLES[name], Float if name == "run_at" else String), farm_schema
    )
    declared = "".join(f"    {kind.postgresql.declare}\n" for kind in KINDS.values() if kind.postgresql.declare)
    return f"""
CREATE OR REPLACE FUNCTION qp_enqueue(
    executor text, target text, payload jsonb DEFAULT NULL, queue text DEFAULT {_quoted(DEFAULT)},
    order_key text DEFAULT NULL, run_at timestamptz DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $qp_enqueue$
DECLARE
    v_executor text := qp_enqueue.executor;
    v_target text := qp_enqueue.target;
    v_payload text := qp_enqueue.payload::text;
    v_queue text := qp_enqueue.queue;
    v_order_key text := qp_enqueue.order_key;
    v_run_at double precision := extract(epoch FROM qp_enqueue.run_at);
    v_origin text := left(format('sql %s pid %s', session_user, pg_backend_pid()), {ORIGIN_LENGTH});
{declared}    v_id bigint;
BEGIN
{_postgresql_checks()}
    {insert_sql} INTO v_id;
    RETURN v_id;
END
$qp_enqueue$;
REVOKE ALL ON FUNCTION {SIGNATURE} FROM PUBLIC;
"""


def _pg_refuse(condition: str, what: str, message: str, shown: str) -> str:
    """A PL/pgSQL refusal: RAISE the message (`shown` fills its %) with the hint for `what`."""
    return (
        f"    IF {condition} THEN\n        RAISE EXCEPTION {_quoted('qp_enqueue: ' + message)}, {shown}"
        f" USING ERRCODE = '22023', HINT = {_quoted(HINTS[what])};\n    END IF;"
    )


def _pg_shown(variable: str) -> str:
    return f"coalesce(quote_literal({variable}), 'NULL')"


def _pg_kind(kind: WorkKind) -> list[str]:
    """qp_enqueue's refusals of a malformed target of `kind` on PostgreSQL, as its row says (rules/kinds.py)."""
    guard, checks = f"v_executor = {_quoted(kind.name)}", kind.postgresql
    setup = [f"    IF {guard} THEN\n        {checks.setup}\n    END IF;"] if checks.setup else []
    return setup + [
        _pg_refuse(f"{guard} AND {condition}", kind.name, message, _pg_shown("v_target"))
        for condition, message in checks.refusals
    ]


def _postgresql_checks() -> str:
    """qp_enqueue's refusals on PostgreSQL, in the order the Python enqueue makes them (work_spec, Farm.submit)."""
    queue_name = "^" + _NAME.pattern.removesuffix(r"\Z") + "$"
    return "\n".join(
        [
            _pg_refuse(
                f"v_executor IS NULL OR v_executor NOT IN ({', '.join(map(_quoted, KINDS))})",
                "executor",
                "unknown executor %",
                _pg_shown("v_executor"),
            ),
            _pg_refuse(
                f"v_target IS NULL OR v_target = '' OR length(v_target) > {TARGET_LENGTH}",
                "target",
                f"a job's target is 1 to {TARGET_LENGTH} characters, not %",
                "coalesce(length(v_target)::text, 'NULL')",
            ),
            *(check for kind in KINDS.values() for check in _pg_kind(kind)),
            _pg_refuse(
                f"v_queue IS NULL OR length(v_queue) > {MAX_NAME} OR v_queue !~ {_quoted(queue_name)}",
                "queue",
                "queue % is not a queue name",
                _pg_shown("v_queue"),
            ),
            _pg_refuse(
                f"v_order_key = '' OR length(v_order_key) > {MAX_ORDER_KEY}",
                "order_key",
                "order key % is refused",
                _pg_shown("v_order_key"),
            ),
            _pg_refuse(
                f"octet_length(v_payload) > {MAX_PAYLOAD}",
                "payload",
                f"payload is % bytes, over the {MAX_PAYLOAD} byte limit",
                "octet_length(v_payload)",
            ),
            _pg_refuse(
                f"v_run_at < 0 OR v_run_at > {LATEST:.0f}", "run_at", "run_at % is out of range", "qp_enqueue.run_at"
            ),
        ]
    )


def mssql_procedure() -> str:
    """CREATE OR ALTER PROCEDURE qp_enqueue: the same parameters, the job's id as its one row. T-SQL has no regular
    expressions: the forms are checked with LIKE, as closely as it allows (the node checks exactly before it runs
    anything); a payload's size is counted in characters."""
    from sqlalchemy.dialects import mssql

    dialect = mssql.dialect()
    insert_sql = _insert(dialect, lambda name: literal_column("@due" if name == "run_at" else f"@{name}"))
    return f"""CREATE OR ALTER PROCEDURE qp_enqueue
    @executor nvarchar(4000), @target nvarchar(4000), @payload nvarchar(max) = NULL,
    @queue nvarchar(4000) = N{_quoted(DEFAULT)}, @order_key nvarchar(4000) = NULL, @run_at datetimeoffset = NULL
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @problem nvarchar(2048);
    DECLARE @due float
        = CAST(DATEDIFF_BIG(microsecond, '19700101', CAST(SWITCHOFFSET(@run_at, '+00:00') AS datetime2)) AS float)
        / 1000000.0;
    DECLARE @origin nvarchar({ORIGIN_LENGTH})
        = LEFT(CONCAT(N'sql ', SUSER_SNAME(), N' spid ', @@SPID), {ORIGIN_LENGTH});
{_mssql_checks()}
    {insert_sql};
END
"""


def _ms_refuse(condition: str, what: str, message: str, shown: str = "") -> str:
    """A T-SQL refusal: THROW the message, `shown` after it, and the hint for `what` (T-SQL has no hint field)."""
    said = f"N{_quoted('qp_enqueue: ' + message)}" + (f", {shown}" if shown else "")
    hint = f"N{_quoted(' (' + HINTS[what] + ')')}"
    return (
        f"    IF {condition}\n    BEGIN\n        SET @problem = CONCAT({said}, {hint});\n"
        "        THROW 51000, @problem, 1;\n    END;"
    )


def _ms_shown(variable: str) -> str:
    quote = "N''''"  # one quote, as T-SQL writes it
    return f"ISNULL({quote} + REPLACE(LEFT({variable}, 200), {quote}, N'''''') + {quote}, N'NULL')"


def _ms_kind(kind: WorkKind) -> list[str]:
    """qp_enqueue's refusals of a malformed target of `kind` on SQL Server, as its row says (rules/kinds.py)."""
    guard = f"@executor = N{_quoted(kind.name)}"
    return [
        _ms_refuse(f"{guard} AND {condition}", kind.name, message, _ms_shown("@target"))
        for condition, message in kind.mssql.refusals
    ]


def _mssql_checks() -> str:
    """qp_enqueue's refusals on SQL Server, each an IF that THROWs (run in order: a later one may rely on an earlier
    one, as OPENJSON does on ISJSON)."""
    return "\n".join(
        [
            _ms_refuse(
                f"@executor IS NULL OR @executor COLLATE Latin1_General_BIN2"
                f" NOT IN ({', '.join('N' + _quoted(e) for e in KINDS)})",
                "executor",
                "unknown executor ",
                _ms_shown("@executor"),
            ),
            _ms_refuse(
                f"@target IS NULL OR @target = N'' OR DATALENGTH(@target) / 2 > {TARGET_LENGTH}",
                "target",
                f"a job's target is 1 to {TARGET_LENGTH} characters",
            ),
            *(check for kind in KINDS.values() for check in _ms_kind(kind)),
            _ms_refuse(
                f"@queue IS NULL OR @queue = N'' OR DATALENGTH(@queue) / 2 > {MAX_NAME}"
                " OR @queue NOT LIKE N'[A-Za-z0-9]%' OR @queue LIKE N'%[^A-Za-z0-9_.-]%'",
                "queue",
                "not a queue name: ",
                _ms_shown("@queue"),
            ),
            _ms_refuse(
                f"@order_key = N'' OR DATALENGTH(@order_key) / 2 > {MAX_ORDER_KEY}",
                "order_key",
                "order key is refused: ",
                _ms_shown("@order_key"),
            ),
            _ms_refuse("@payload IS NOT NULL AND ISJSON(@payload) = 0", "payload", "payload is not valid JSON"),
            _ms_refuse(
                f"DATALENGTH(@payload) / 2 > {MAX_PAYLOAD}",
                "payload",
                f"payload is over the {MAX_PAYLOAD} character limit",
            ),
            _ms_refuse(f"@due < 0 OR @due > {LATEST:.0f}", "run_at", "run_at is out of range"),
        ]
    )
