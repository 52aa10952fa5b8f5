"""The door the database itself enqueues through (docs/sql-enqueue.md): `qp_enqueue(executor, target, payload,
queue, order_key, run_at)`, a PL/pgSQL function on PostgreSQL and a procedure of the same name on SQL Server, for a
trigger or any SQL client to enqueue in its own transaction. (SQLite has no stored code: enqueue from Python.) On
PostgreSQL it also takes a key and its terms (key_scope, key_until, key_for, on_conflict, debounce, max_delay) and
settles a conflict as JobStore.made does, from the same conditions (store/key_holds.py), and last the W3C
traceparent of the caller's trace, kept on the job (docs/design.md §12).

It checks what the Python enqueue checks of a job's form and the farm's bounds (a known executor, the target's form,
the queue's name, the order key, the payload's size, the time), each refusal one error with a hint, and inserts the
row the Python enqueue inserts: the statement is generated from the same row (inserts.job_row), the same default of
every column (JobSpec's), the same database time (dbtime) and queue gate (statements.gated_now). The insert fires
the jobs table's NOTIFY trigger, so on PostgreSQL it wakes the farm through push once the caller commits.

It is the only door a role that may enqueue needs, and it opens onto nothing more: it runs with its owner's rights
(SECURITY DEFINER on PostgreSQL, ownership chaining on SQL Server), so such a role is granted EXECUTE on it and
nothing of the farm's tables; and its parameters name none of what a row could be made to squat with (a state, a
lease, an owner, parents to wait for, a kind, a key of the farm's own: a schedule's occurrence or a singleton's,
refused as the Python enqueue refuses them): its job is a queued job like any other. On PostgreSQL
its search_path is pinned to pg_catalog and pg_temp, last, and the farm's tables are named with their schema, so a
caller's own objects (a same-named function or table in a schema of its own, or a temporary table) cannot divert it
(PostgreSQL's "Writing SECURITY DEFINER Functions Safely"); and PUBLIC may not execute it, only the roles granted.

What it cannot check is what the Python enqueue checks against the live machines' allow-lists: that needs the
machines judged alive in Python (Farm.check_allowed). A node refuses at run time, with the reason, any work its own
allow-lists do not admit; such a job fails that one run and never runs anywhere.
"""

from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    DDL,
    BigInteger,
    ColumnDefault,
    Float,
    String,
    case,
    func,
    insert,
    literal_column,
    text,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement

from ..rules.job import JobSpec
from ..rules.keys import NAMED, OnConflict
from ..rules.kinds import KINDS, TARGETS_SAID, WorkKind
from ..rules.limits import LATEST, MAX_PAYLOAD
from ..rules.queues import _NAME, _NAME_RULE, DEFAULT, MAX_NAME, MAX_ORDER_KEY
from ..rules.tracecontext import TRACEPARENT, TRACEPARENT_SAID
from .dbtime import db_now
from .inserts import OCCURRENCE_KEY, SINGLETON_PREFIX, job_row
from .key_holds import debounced_at, holder_read
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
    "key": "its terms are in docs/sql-enqueue.md, as `enqueue --help` words them",
    "held": "give on_conflict => 'existing' or 'replace', or another key",
    "started": "give the key key_scope => 'waiting' to enqueue anew once its job starts",
    "traceparent": TRACEPARENT_SAID,
}
# Its signature, as GRANT and REVOKE name it on PostgreSQL, and the former ones an upgrade replaces.
FORMER_SIGNATURE = "qp_enqueue(text, text, jsonb, text, text, timestamptz)"  # schema 7 to 15: without a key
KEYED_SIGNATURE = FORMER_SIGNATURE.removesuffix(")") + ", text, text, timestamptz, interval, text, interval, interval)"
SIGNATURE = KEYED_SIGNATURE.removesuffix(")") + ", text)"  # schema 17: a traceparent last (docs/design.md §12)
FORMER_SIGNATURES = (FORMER_SIGNATURE, KEYED_SIGNATURE)  # schema 16: with a key, without a traceparent
TARGET_LENGTH = jobs.c.target.type.length  # type: ignore[attr-defined]
KEY_LENGTH = jobs.c.key.type.length  # type: ignore[attr-defined]
ORIGIN_LENGTH = jobs.c.origin.type.length  # type: ignore[attr-defined]


def create_sql_functions(conn: Connection) -> None:
    """(Re)create qp_enqueue on a PostgreSQL or SQL Server farm database, in the caller's transaction (a grant of
    EXECUTE already made is kept), and on PostgreSQL the coalesced push its commits wake the farm by (sql/push.py).
    On PostgreSQL it names the farm's tables in the schema they were made in: the first of the creating session's
    search_path, as create_all made them."""
    if conn.dialect.name == "postgresql":
        schema = farm_schema(conn)
        run(conn, push_ddl(schema))
        granted = _former_door_closed(conn)
        run(conn, postgresql_function(schema))
        for role in granted:  # the database's own names (regrole's text is quoted where it must be), never input
            conn.execute(DDL(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {role}"))
    elif conn.dialect.name == "mssql":
        run(conn, mssql_procedure())


def _former_door_closed(conn: Connection) -> list[str]:
    """PostgreSQL: drop each former qp_enqueue (six parameters before schema 16, thirteen in 16), which a call naming
    fewer parameters would find beside today's; the roles granted them, to be granted today's."""
    roles: list[str] = []
    for signature in FORMER_SIGNATURES:
        if conn.execute(text("SELECT to_regprocedure(:f)"), dict(f=signature)).scalar() is None:
            continue
        roles += [r for r in conn.execute(_PG_CALLERS, dict(f=signature)).scalars() if r not in roles]
        conn.execute(DDL(f"DROP FUNCTION {signature}"))
    return roles


_PG_CALLERS = text(
    "SELECT DISTINCT CAST(a.grantee AS regrole)::text FROM pg_proc p, aclexplode(p.proacl) AS a "
    "WHERE p.oid = to_regprocedure(:f) AND a.privilege_type = 'EXECUTE' AND a.grantee NOT IN (0, p.proowner)"
)


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


def _insert(
    dialect: Any, value: Callable[[str], ColumnElement[Any]], farm_schema: str | None = None, keyed: bool = False
) -> str:
    """The Python enqueue's insert of one job (JobStore.enqueue), its given columns read through `value` (a variable
    of the stored code), every other column as a default JobSpec fills it; returning the new id. With `farm_schema`,
    every table is named in it; with `keyed`, the job's key and its terms are given too."""
    row = job_row(JobSpec(executor="", target=""))
    named = ("executor", "target", "payload", "queue", "order_key", "origin", *(KEY_COLUMNS if keyed else ()))
    named += ("traceparent",) if keyed else ()
    given = {name: value(name) for name in named}
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
    return _compiled(statement, dialect, farm_schema)


def _compiled(statement: Any, dialect: Any, farm_schema: str | None = None) -> str:
    """`statement` as the stored code's text, its values inlined, its tables named in `farm_schema` if given."""
    translated: dict[str, Any] = (
        {"schema_translate_map": {None: farm_schema}, "render_schema_translate": True} if farm_schema else {}
    )
    return str(statement.compile(dialect=dialect, compile_kwargs={"literal_binds": True}, **translated))


# The function's variables, named for the columns they fill (names, never values, in its text).
KEY_COLUMNS = ("key", "key_scope", "key_hold")
_VARIABLES = {
    name: "v_" + name
    for name in ("executor", "target", "payload", "queue", "order_key", "origin", "run_at", *KEY_COLUMNS, "traceparent")
}
_FLOATS = ("run_at", "key_hold")


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def postgresql_function(farm_schema: str) -> str:
    """CREATE OR REPLACE FUNCTION qp_enqueue(...) RETURNS bigint: the job's id; it runs with its owner's rights on
    the tables of `farm_schema`, and only the roles granted EXECUTE may call it."""
    from sqlalchemy.dialects import postgresql

    dialect = postgresql.dialect()
    insert_sql = _insert(
        dialect,
        lambda name: literal_column(_VARIABLES[name], Float if name in _FLOATS else String),
        farm_schema,
        keyed=True,
    )
    declared = "".join(f"    {kind.postgresql.declare}\n" for kind in KINDS.values() if kind.postgresql.declare)
    return f"""
CREATE OR REPLACE FUNCTION qp_enqueue(
    executor text, target text, payload jsonb DEFAULT NULL, queue text DEFAULT {_quoted(DEFAULT)},
    order_key text DEFAULT NULL, run_at timestamptz DEFAULT NULL, key text DEFAULT NULL, key_scope text DEFAULT NULL,
    key_until timestamptz DEFAULT NULL, key_for interval DEFAULT NULL, on_conflict text DEFAULT NULL,
    debounce interval DEFAULT NULL, max_delay interval DEFAULT NULL, traceparent text DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $qp_enqueue$
DECLARE
    v_executor text := qp_enqueue.executor;
    v_target text := qp_enqueue.target;
    v_payload text := qp_enqueue.payload::text;
    v_queue text := qp_enqueue.queue;
    v_order_key text := qp_enqueue.order_key;
    v_run_at double precision := extract(epoch FROM qp_enqueue.run_at);
    v_origin text := left(format('sql %s pid %s', session_user, pg_backend_pid()), {ORIGIN_LENGTH});
    v_traceparent text := lower(nullif(btrim(qp_enqueue.traceparent), ''));
{declared}{KEY_DECLARED}    v_id bigint;
BEGIN
{_postgresql_checks()}
{_postgresql_key_checks()}
{_pg_refuse(TRACE_REFUSED, "traceparent", "traceparent % is not a W3C traceparent", _pg_shown("v_traceparent"))}
    IF v_key IS NULL THEN
        {insert_sql} INTO v_id;
        RETURN v_id;
    END IF;
{settled(farm_schema, insert_sql)}
END
$qp_enqueue$;
REVOKE ALL ON FUNCTION {SIGNATURE} FROM PUBLIC;
"""


# A malformed traceparent (rules/tracecontext.py's pattern, read by PostgreSQL's regular expressions).
TRACE_REFUSED = "v_traceparent !~ " + _quoted("^" + TRACEPARENT.pattern.removesuffix(r"\Z") + "$")


def _pg_refuse(condition: str, what: str, message: str, shown: str | None) -> str:
    """A PL/pgSQL refusal: RAISE the message (`shown`, if any, fills its %) with the hint for `what`."""
    return (
        f"    IF {condition} THEN\n        RAISE EXCEPTION {_quoted('qp_enqueue: ' + message)}"
        f"{'' if shown is None else ', ' + shown}"
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


# The key's terms as its row takes them (rules/keys.py key_terms), and how a conflict is settled.
KEY_DECLARED = """    v_key text := qp_enqueue.key;
    v_key_scope text := CASE WHEN qp_enqueue.key_until IS NOT NULL THEN 'until' WHEN qp_enqueue.key_for IS NOT NULL
        THEN 'after' WHEN qp_enqueue.debounce IS NOT NULL THEN 'waiting' WHEN qp_enqueue.key_scope <> 'kept'
        THEN qp_enqueue.key_scope END;
    v_key_hold double precision := coalesce(extract(epoch FROM qp_enqueue.key_until),
        extract(epoch FROM qp_enqueue.key_for));
    v_debounce double precision := extract(epoch FROM qp_enqueue.debounce);
    v_max_delay double precision := extract(epoch FROM qp_enqueue.max_delay);
    v_settles text := coalesce(qp_enqueue.on_conflict,
        CASE WHEN qp_enqueue.debounce IS NOT NULL THEN 'replace' ELSE 'reject' END);
    h_id bigint;
    h_holding boolean;
    h_waiting boolean;
"""
SETTLE_TRIES = 10  # as JobStore.made: a key taken, then given up, then taken again, this many times at most


def settled(farm_schema: str, insert_sql: str) -> str:
    """PL/pgSQL: JobStore.made's loop, in the caller's transaction: insert; if the key is taken, settle with its
    holder under its row's lock (store/key_holds.py's conditions, compiled), or give the key up for it and insert
    again. Only a call with a key enters it (a block that catches an error costs a subtransaction)."""
    from sqlalchemy.dialects import postgresql

    dialect = postgresql.dialect()
    now = db_now()
    read = holder_read(literal_column("v_key", String))
    holder = literal_column("h_id", BigInteger)
    debounce, max_delay = literal_column("v_debounce", Float), literal_column("v_max_delay", Float)
    when = case(
        (debounce.is_(None), func.coalesce(literal_column("v_run_at", Float), now)),
        else_=debounced_at(dialect.name, jobs, now, debounce, max_delay),
    )
    payload = case(
        (literal_column("v_settles", String) == "replace", literal_column("v_payload", String)), else_=jobs.c.payload
    )
    moved = update(jobs).where(jobs.c.id == holder).values(run_at=when, payload=payload)
    freed = update(jobs).where(jobs.c.id == holder).values(key=None)
    held = _quoted("qp_enqueue: key % is held by job %")
    started = _quoted(
        "qp_enqueue: job % holds key % and has started: replace and debounce change only a job that waits"
    )
    return f"""    FOR attempt IN 1..{SETTLE_TRIES} LOOP
        BEGIN
            {insert_sql} INTO v_id;
            RETURN v_id;
        EXCEPTION WHEN unique_violation THEN
            NULL;
        END;
        {_compiled(read, dialect, farm_schema)} INTO h_id, h_holding, h_waiting;
        CONTINUE WHEN NOT FOUND;
        IF NOT h_holding THEN
            {_compiled(freed, dialect, farm_schema)};
            CONTINUE;
        END IF;
        IF v_settles = 'reject' THEN
            RAISE EXCEPTION {held}, quote_literal(v_key), h_id
                USING ERRCODE = '23505', HINT = {_quoted(HINTS["held"])};
        END IF;
        IF v_settles = 'existing' AND v_debounce IS NULL THEN
            RETURN h_id;
        END IF;
        IF NOT h_waiting THEN
            RAISE EXCEPTION {started}, h_id, quote_literal(v_key)
                USING ERRCODE = '55000', HINT = {_quoted(HINTS["started"])};
        END IF;
        {_compiled(moved, dialect, farm_schema)};
        RETURN h_id;
    END LOOP;
    RAISE EXCEPTION 'qp_enqueue: key % was taken and given up {SETTLE_TRIES} times', quote_literal(v_key)
        USING ERRCODE = '40001', HINT = 'try again';"""


def _postgresql_key_checks() -> str:
    """qp_enqueue's refusals of a key and its terms on PostgreSQL, as rules/keys.py key_terms and inserts.check_key
    make them."""
    from sqlalchemy.dialects import postgresql

    terms = ("key_scope", "key_until", "key_for", "on_conflict", "debounce", "max_delay")
    given = " OR ".join(f"qp_enqueue.{name} IS NOT NULL" for name in terms)
    reserved = "^(?:" + OCCURRENCE_KEY.pattern + ")$"
    window = "(qp_enqueue.key_until IS NOT NULL OR qp_enqueue.key_for IS NOT NULL)"
    refusals = [
        (f"v_key IS NULL AND ({given})", "a key's terms need a key: give key => ...", None),
        (f"length(v_key) > {KEY_LENGTH}", f"key is % characters, over {KEY_LENGTH}", "length(v_key)"),
        (
            f"v_key LIKE {_quoted(SINGLETON_PREFIX + '%')} OR v_key ~ {_quoted(reserved)}",
            "key % has the form of a schedule's occurrence or a singleton's key, kept for them",
            _pg_shown("v_key"),
        ),
        (
            f"qp_enqueue.key_scope NOT IN ({', '.join(map(_quoted, NAMED))})",
            "key_scope % is none of " + ", ".join(NAMED),
            _pg_shown("qp_enqueue.key_scope"),
        ),
        (
            f"qp_enqueue.on_conflict NOT IN ({', '.join(map(_quoted, OnConflict))})",
            "on_conflict % is none of " + ", ".join(OnConflict),
            _pg_shown("qp_enqueue.on_conflict"),
        ),
        (
            "qp_enqueue.key_until IS NOT NULL AND qp_enqueue.key_for IS NOT NULL",
            "give key_until or key_for, not both",
            None,
        ),
        (
            f"{window} AND qp_enqueue.key_scope <> 'unfinished' OR qp_enqueue.debounce IS NOT NULL AND "
            f"(qp_enqueue.key_scope NOT IN ('kept', 'waiting') OR {window})",
            "key_scope % does not go with the key's window or debounce",
            _pg_shown("qp_enqueue.key_scope"),
        ),
        ("qp_enqueue.key_for <= interval '0'", "key_for % is not after success", "qp_enqueue.key_for"),
        ("qp_enqueue.debounce <= interval '0'", "debounce % is not a positive time", "qp_enqueue.debounce"),
        (
            "qp_enqueue.max_delay IS NOT NULL AND "
            "(qp_enqueue.debounce IS NULL OR qp_enqueue.max_delay < qp_enqueue.debounce)",
            "max_delay % needs a debounce no longer than it",
            "qp_enqueue.max_delay",
        ),
        (
            "qp_enqueue.debounce IS NOT NULL AND (qp_enqueue.on_conflict = 'reject' OR qp_enqueue.run_at IS NOT NULL)",
            "debounce sets the job's time and moves the waiting job: give no run_at and no on_conflict reject",
            None,
        ),
    ]
    return "\n".join(_pg_refuse(condition, "key", message, shown) for condition, message, shown in refusals) + (
        f"\n    IF v_debounce IS NOT NULL THEN\n        v_run_at := {_compiled(db_now(), postgresql.dialect())}"
        " + v_debounce;\n    END IF;"
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
