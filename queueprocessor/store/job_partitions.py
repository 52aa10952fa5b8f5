"""Finished jobs pruned by partition on PostgreSQL (docs/design.md §11): qp_jobs is partitioned by contiguous ranges
of id, each about a day of this farm's enqueues, and qp_runs and qp_payloads by the same ranges of job_id, so a range
goes with everything that hangs off it, dropped whole once every job in it has finished and passed its queue's keep.

Ids stay what users know (1, 2, 3, ...): the sequence is never moved; the ranges follow it. The housekeeping keeps
AHEAD ranges made beyond the one the sequence is in, each `max(MIN_SPAN, ids given in the last day)` wide, so a range
fills in about a day whatever the rate. A job's partition is fixed when it is inserted, so no claim, renewal or finish
moves a row, and each of them, and every look-up by id, prunes to one partition by the primary key. A burst that
outruns the ranges made (or an id given by hand) lands in the default partition, so no insert fails; the next upkeep
makes its ranges above the default's highest id, and the DELETE path (JobStore.prune) takes the default's finished
jobs at their keep. Correctness never depends on a range matching a day: a range goes only when every job in it has.
The table an older schema made becomes the first partition, every id given before it (`qp_jobs_below_N`); the
others are named by their first id (`qp_jobs_from_N`).

A partitioned table's unique index must hold its partition key, so two farm-wide rules move to side tables kept by
triggers that fire only for the rows they concern: a job's key, unique while its row is kept (qp_job_keys, whose
key is named ux_qp_jobs_key: a duplicate enqueue fails as it always did), and the running job of an order key, one
at a time (qp_running_order_keys, ux_qp_jobs_order_running). A dropped partition fires no trigger: its drop deletes
its keys itself. SQLite and SQL Server keep one table, pruned by DELETE (JobStore.prune).
"""

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    and_,
    column,
    event,
    exists,
    false,
    func,
    inspect,
    or_,
    select,
    table,
    text,
    true,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from ..rules.queues import MAX_NAME, MAX_ORDER_KEY
from ..rules.states import JobState
from . import schema
from .partitions import DAY, LOCK_NOT_AVAILABLE
from .sql.ddl import farm_schema, quoted, run, side_triggers

# The narrowest range made: a quiet farm's ranges last longer than a day (a million ids: a few hundred MB of rows at
# most, few partitions for the claim to walk), and a burst of a million jobs on it still lands in a range made ahead.
MIN_SPAN = 1_000_000
AHEAD = 2  # ranges made beyond the one the sequence is in: a day's chores may be missed before the default fills
# How long past its keep a finished job of a closed range waits for its range to go whole before the DELETE path
# takes it: a range holds about a day of enqueues, so a range not dropped by then is held (docs/design.md §11).
GRACE = 2 * DAY
LOCK_WAIT = "200ms"  # a drop or a new range holds qp_jobs alone for a moment: every claim waits behind it
KEYS = "qp_job_keys"
RUNNING_ORDER_KEYS = "qp_running_order_keys"
SEQUENCE = "qp_jobs_id_seq"
# Each table partitioned by job id, with the column that holds it.
TABLES = (("qp_jobs", "id"), ("qp_runs", "job_id"), (schema.PAYLOADS, "job_id"))
# The unique indexes of the plain qp_jobs, and the plain ones a partitioned qp_jobs has in their place.
PLAIN = {
    "ux_qp_jobs_key": "CREATE INDEX ix_qp_jobs_key ON qp_jobs (key) WHERE key IS NOT NULL",
    "ux_qp_jobs_order_running": "CREATE INDEX ix_qp_jobs_order_running ON qp_jobs (queue, order_key) "
    "WHERE order_key IS NOT NULL AND state = 'running'",
}
UNIQUE = tuple(PLAIN)
TRIGGERS_BEFORE = ("qp_payloads_added", "qp_payloads_changed", "qp_payloads_gone", "qp_jobs_push")
BOUND = re.compile(r"FROM \((?:MINVALUE|'?(-?\d+)'?)\) TO \('?(-?\d+)'?\)")


@dataclass(frozen=True)
class Part:
    """One partition of qp_jobs (and of qp_runs and qp_payloads): its ids [lo, hi), lo None for every id below hi
    (the first, an older schema's table)."""

    lo: int | None
    hi: int

    def name(self, table_name: str) -> str:
        return f"{table_name}_below_{self.hi}" if self.lo is None else f"{table_name}_from_{self.lo}"

    def ids(self, ids: Any) -> list[ColumnElement[bool]]:
        """The rows of this partition, by `ids` (a column holding job ids)."""
        return [ids < self.hi] + ([ids >= self.lo] if self.lo is not None else [])


def _quoted(conn: Connection, name: str) -> str:
    return str(conn.dialect.identifier_preparer.quote(name))


def parts(conn: Connection) -> list[Part]:
    """qp_jobs' partitions by range, lowest first (not the default), read from their bounds in the catalog."""
    bounds = conn.execute(
        text(
            "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'qp_jobs'::regclass"
        )
    ).scalars()
    found = []
    for bound in bounds:
        if matched := BOUND.search(bound):
            lo, hi = matched.groups()
            found.append(Part(None if lo is None else int(lo), int(hi)))
    return sorted(found, key=lambda part: part.hi)


def next_id(conn: Connection) -> int:
    """The id the sequence gives next (read without taking it)."""
    return int(
        conn.execute(
            text(f"SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM {SEQUENCE}")
        ).scalar_one()
    )


def given_since(conn: Connection, since: float) -> int:
    """How many ids the sequence gave since `since` (database time): from the first job created since then, found
    by bisecting ids by primary key (a job's created_at grows with its id; a few dozen look-ups), to the next id."""
    after = text("SELECT id, created_at FROM qp_jobs WHERE id >= :id ORDER BY id LIMIT 1")
    top = next_id(conn)
    lowest = conn.execute(text("SELECT min(id) FROM qp_jobs")).scalar()
    if lowest is None:
        return 0
    lo, hi = int(lowest), top
    while lo < hi:  # the first id from which every job was created since: in [lo, hi]
        mid = (lo + hi) // 2
        row = conn.execute(after, dict(id=mid)).first()
        if row is not None and row.created_at >= since:
            hi = mid
        else:
            lo = min(row.id + 1 if row is not None else mid + 1, hi)
    return top - lo


def side_ddl(farm_schema: str) -> str:
    """The side tables that keep keys and running order keys unique farm-wide, and their triggers' function."""
    s = quoted(farm_schema)
    running = "{0}.state = 'running' AND {0}.order_key IS NOT NULL"
    return f"""
CREATE TABLE IF NOT EXISTS {KEYS} (key varchar(400) NOT NULL, job_id bigint NOT NULL,
    CONSTRAINT ux_qp_jobs_key PRIMARY KEY (key));
CREATE TABLE IF NOT EXISTS {RUNNING_ORDER_KEYS} (queue varchar({MAX_NAME}) NOT NULL,
    order_key varchar({MAX_ORDER_KEY}) NOT NULL, job_id bigint NOT NULL,
    CONSTRAINT ux_qp_jobs_order_running PRIMARY KEY (queue, order_key));
CREATE OR REPLACE FUNCTION qp_job_keys_kept() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF TG_OP <> 'INSERT' AND OLD.key IS NOT NULL THEN
    DELETE FROM {s}.{KEYS} WHERE key = OLD.key AND job_id = OLD.id;
  END IF;
  IF TG_OP <> 'DELETE' AND NEW.key IS NOT NULL THEN
    INSERT INTO {s}.{KEYS} (key, job_id) VALUES (NEW.key, NEW.id);
  END IF;
  RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION qp_running_order_keys_kept() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF TG_OP <> 'INSERT' AND {running.format("OLD")} THEN
    DELETE FROM {s}.{RUNNING_ORDER_KEYS} WHERE queue = OLD.queue AND order_key = OLD.order_key AND job_id = OLD.id;
  END IF;
  IF TG_OP <> 'DELETE' AND {running.format("NEW")} THEN
    INSERT INTO {s}.{RUNNING_ORDER_KEYS} (queue, order_key, job_id) VALUES (NEW.queue, NEW.order_key, NEW.id);
  END IF;
  RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION qp_job_keys_kept() FROM PUBLIC;
REVOKE ALL ON FUNCTION qp_running_order_keys_kept() FROM PUBLIC;
"""


def _side_triggers() -> str:
    """The triggers on the partitioned qp_jobs that keep the side tables (cloned to every partition)."""
    running = "({0}.state = 'running' AND {0}.order_key IS NOT NULL)"
    moved = f"{running.format('OLD')} IS DISTINCT FROM {running.format('NEW')} OR ({running.format('NEW')} AND "
    moved += "(OLD.queue, OLD.order_key) IS DISTINCT FROM (NEW.queue, NEW.order_key))"
    return (
        side_triggers(KEYS, "key", "qp_job_keys_kept")
        + f"""CREATE TRIGGER qp_running_order_keys_added AFTER INSERT ON qp_jobs
FOR EACH ROW WHEN {running.format("NEW")} EXECUTE FUNCTION qp_running_order_keys_kept();
CREATE TRIGGER qp_running_order_keys_changed AFTER UPDATE OF state, queue, order_key ON qp_jobs
FOR EACH ROW WHEN ({moved}) EXECUTE FUNCTION qp_running_order_keys_kept();
CREATE TRIGGER qp_running_order_keys_gone AFTER DELETE ON qp_jobs
FOR EACH ROW WHEN {running.format("OLD")} EXECUTE FUNCTION qp_running_order_keys_kept();
"""
    )


def _parent_indexes(conn: Connection, table_name: str) -> None:
    """The indexes of the partitioned `table_name`, cloned to every partition (an equal one there is taken as is)."""
    if table_name == schema.PAYLOADS:
        run(conn, f"ALTER TABLE {table_name} ADD PRIMARY KEY (job_id)")
        run(conn, f"CREATE INDEX {schema.PAYLOADS_INDEX} ON {table_name} USING gin (doc jsonb_path_ops)")
        return
    whole = schema.jobs if table_name == "qp_jobs" else schema.runs
    there = {column["name"] for column in inspect(conn).get_columns(table_name)}
    for index in whole.indexes:  # an index of a later version's columns is made by that version's step
        if index.name not in UNIQUE and {column.name for column in index.columns} <= there:
            index.create(conn)
    if whole is schema.jobs:
        run(conn, "ALTER TABLE qp_jobs ADD PRIMARY KEY (id)")
        for definition in PLAIN.values():
            run(conn, definition)


def _into_first_partition(conn: Connection, table_name: str, key: str, first: Part) -> None:
    """Make `table_name` (plain, with rows) partitioned by range of `key`, itself its first partition: every id
    below `first.hi`. Its indexes are renamed and kept (equal to the new table's, they are attached as they are,
    unbuilt), a CHECK validated first spares ATTACH its scan, its sequence and its grants go to the new table."""
    old = first.name(table_name)
    run(conn, f"ALTER TABLE {table_name} RENAME TO {old}")
    indexes = conn.execute(
        text("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = CAST(:t AS regclass)"), dict(t=old)
    ).scalars()
    for index_name in list(indexes):
        run(conn, f"ALTER INDEX {index_name} RENAME TO {_quoted(conn, old + '_' + index_name.removeprefix('ux_'))}")
    run(conn, f"CREATE TABLE {table_name} (LIKE {old} INCLUDING DEFAULTS) PARTITION BY RANGE ({key})")
    if table_name != schema.PAYLOADS:  # the others take their ids from a sequence of their own
        serial = conn.execute(text("SELECT pg_get_serial_sequence(:t, 'id')"), dict(t=old)).scalar()
        run(conn, f"ALTER SEQUENCE {serial} OWNED BY {table_name}.id")
    grants = conn.execute(
        text(
            "SELECT a.privilege_type, CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END "
            "FROM pg_class c, aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee "
            "WHERE c.oid = CAST(:t AS regclass) AND a.grantee <> c.relowner"
        ),
        dict(t=old),
    ).all()
    for privilege, grantee in grants:
        run(conn, f"GRANT {privilege} ON {table_name} TO {grantee}")
    _parent_indexes(conn, table_name)
    run(conn, f"ALTER TABLE {old} ADD CONSTRAINT {old}_ids CHECK ({key} < {first.hi}) NOT VALID")
    run(conn, f"ALTER TABLE {old} VALIDATE CONSTRAINT {old}_ids")
    run(conn, f"ALTER TABLE {table_name} ATTACH PARTITION {old} FOR VALUES FROM (MINVALUE) TO ({first.hi})")
    run(conn, f"ALTER TABLE {old} DROP CONSTRAINT {old}_ids")
    for unique in UNIQUE:
        run(conn, f"DROP INDEX IF EXISTS {old}_{unique.removeprefix('ux_')}")
    run(conn, f"CREATE TABLE {table_name}_default PARTITION OF {table_name} DEFAULT{_fill(table_name)}")


def _fill(table_name: str) -> str:
    return f" WITH (fillfactor = {schema.JOBS_FILL})" if table_name == "qp_jobs" else ""


def _now(conn: Connection) -> float:
    return float(conn.execute(text("SELECT extract(epoch FROM now())")).scalar_one())


def partition_jobs(conn: Connection) -> None:
    """Make a plain qp_jobs, qp_runs and qp_payloads (new and empty, or an older schema's with rows) partitioned by
    range of job id, in the caller's transaction: each the first partition of its new table (every id given so far),
    the side tables filled from the rows there, the triggers on the new qp_jobs, and the ranges ahead made. Nothing
    to do if qp_jobs is partitioned already."""
    kind = text("SELECT relkind FROM pg_class WHERE oid = 'qp_jobs'::regclass")
    if conn.execute(kind).scalar() == "p":
        return
    run(conn, "LOCK TABLE qp_jobs, qp_runs IN ACCESS EXCLUSIVE MODE")
    given = conn.execute(text("SELECT max(id) + 1 FROM qp_jobs")).scalar()
    first = Part(None, max(next_id(conn), given or 0))
    for trigger in TRIGGERS_BEFORE:
        run(conn, f"DROP TRIGGER IF EXISTS {trigger} ON qp_jobs")
    for table_name, key in TABLES:
        _into_first_partition(conn, table_name, key, first)
    run(conn, side_ddl(farm_schema(conn)))
    run(conn, f"INSERT INTO {KEYS} (key, job_id) SELECT key, id FROM qp_jobs WHERE key IS NOT NULL")
    run(
        conn,
        f"INSERT INTO {RUNNING_ORDER_KEYS} (queue, order_key, job_id) SELECT queue, order_key, id FROM qp_jobs "
        "WHERE state = 'running' AND order_key IS NOT NULL",
    )
    run(conn, _side_triggers())
    schema.keep_payloads_apart(conn)  # its triggers again, on the new qp_jobs (its table is made already)
    make_ranges(conn, ranges_wanted(conn, _now(conn)))


def ranges_wanted(conn: Connection, now: float) -> list[Part]:
    """The ranges to make so that AHEAD are made beyond the one the sequence is in (none, mostly): contiguous from
    the highest made, or from above the sequence and the default partition's rows after a burst outran them; each
    `max(MIN_SPAN, ids given in the day before `now`)` wide."""
    made, at = parts(conn), next_id(conn)
    inside = any((part.lo is None or part.lo <= at) and at < part.hi for part in made)
    beyond = sum(1 for part in made if part.lo is not None and part.lo > at)
    missing = AHEAD + (0 if inside else 1) - beyond
    if missing <= 0:
        return []
    # Above the sequence, and above the default's rows (a burst's, or ids given by hand): they stay where they are.
    held = conn.execute(text("SELECT max(id) + 1 FROM qp_jobs_default")).scalar()
    top = max(made[-1].hi if made else at, at, held or at)
    span = max(MIN_SPAN, given_since(conn, now - DAY))
    return [Part(top + n * span, top + (n + 1) * span) for n in range(missing)]


def make_ranges(conn: Connection, wanted: list[Part]) -> None:
    """Make the partitions of `wanted`, of each table (each CREATE takes its table alone for a moment)."""
    for part in wanted:
        for table_name, _ in TABLES:
            run(
                conn,
                f"CREATE TABLE {part.name(table_name)} PARTITION OF {table_name} "
                f"FOR VALUES FROM ({part.lo}) TO ({part.hi}){_fill(table_name)}",
            )


def closed_ids(conn: Connection) -> ColumnElement[bool]:
    """The jobs of the ranges the sequence has passed (closed: no id will be given in them again), which wait for
    their range to go whole until GRACE past their keep; the others (of the open range, or the default) the DELETE
    path takes at their keep."""
    at, spans = next_id(conn), list[Part]()
    for part in parts(conn):
        if part.hi > at:
            break
        if spans and spans[-1].hi == part.lo:
            spans[-1] = Part(spans[-1].lo, part.hi)
        else:
            spans.append(part)
    return or_(false(), *(and_(*span.ids(schema.jobs.c.id)) for span in spans))


def _pinned(part: Part, past_keep: ColumnElement[bool], latest: Any) -> Any:
    """Whether `part` holds a job that is not finished, or not past its keep: each by an index of the state it asks
    of (the queued, the running, the failed or cancelled, the succeeded by end: a BRIN, read by a bitmap, which the
    caller allows), each predicate written as its index's is, so that the check is quick under the table's lock."""
    jobs = schema.jobs
    ids = part.ids(jobs.c.id)
    finished_young = ~past_keep
    asks = [
        and_(jobs.c.state == JobState.QUEUED, jobs.c.gated == false()),
        and_(jobs.c.state == JobState.QUEUED, jobs.c.gated == true()),
        jobs.c.state == JobState.RUNNING,
        and_(jobs.c.state.in_((JobState.FAILED, JobState.CANCELLED)), finished_young),
        and_(jobs.c.state == JobState.SUCCEEDED, jobs.c.finished_at >= latest, finished_young),
    ]
    return or_(*(exists().where(*ids, ask) for ask in asks))


def _held(conn: Connection, part: Part, past_keep: ColumnElement[bool], latest: float) -> bool:
    """_pinned, asked in the caller's transaction with bitmap scans allowed (the farm's sessions plan none)."""
    run(conn, "SET LOCAL enable_bitmapscan = on")
    return bool(conn.execute(select(_pinned(part, past_keep, latest))).scalar())


def detached(conn: Connection) -> list[str]:
    """The ranges of qp_jobs detached by a drop that did not get to drop them (its process ended): plain tables
    named as ranges are, no longer partitions."""
    return list(
        conn.execute(
            text(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND NOT relispartition AND relname ~ "
                "'^qp_jobs_(from|below)_[0-9]+$' AND relnamespace = CAST(current_schema() AS regnamespace)"
            )
        ).scalars()
    )


def drop_ranges(engine: Engine, now: float, keeps: list[float], past_keep: ColumnElement[bool]) -> int:
    """Drop every closed range of qp_jobs (with its runs' and payloads') whose every job has finished and passed its
    keep (`past_keep`; `keeps`: every queue's), with its keys and its rows of qp_deps and qp_flow_jobs; how many jobs
    went. Checked first without a lock, then again, by index, under the lock on qp_jobs that DETACH takes (waiting
    LOCK_WAIT at most: a long read of qp_jobs puts the drop off to the next pass), which is held only for that check
    and the detach: the rest is done on the detached tables, which no statement of the farm reads any more."""
    latest = now - max(keeps)
    with engine.begin() as conn:
        at = next_id(conn)
        closed = [part for part in parts(conn) if part.hi <= at]
        droppable = [part for part in closed if not _held(conn, part, past_keep, latest)]
        left = detached(conn)
    gone = sum(_drop_detached(engine, name) for name in left)
    for part in droppable:
        try:
            with engine.begin() as conn:
                run(conn, f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                run(conn, "LOCK TABLE qp_jobs, qp_runs, qp_payloads IN ACCESS EXCLUSIVE MODE")
                if not _detach(conn, part, past_keep, latest):
                    continue
        except OperationalError as error:
            if getattr(error.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                return gone
            raise
        gone += _drop_detached(engine, part.name("qp_jobs"))
    return gone


def _detach(conn: Connection, part: Part, past_keep: ColumnElement[bool], latest: float) -> bool:
    """Under the lock: detach `part` of each table unless it holds a job (checked again); whether it did."""
    if _held(conn, part, past_keep, latest):
        return False
    for table_name, _ in TABLES:
        run(conn, f"ALTER TABLE {table_name} DETACH PARTITION {part.name(table_name)}")
    return True


def _drop_detached(engine: Engine, jobs_name: str) -> int:
    """Drop the detached range of qp_jobs named `jobs_name` and its runs' and payloads', in one transaction that
    takes no lock on the farm's tables; first delete its keys from the side table (a drop fires no trigger: until
    then a key of it still refuses a new job, as before the drop) and the rows naming its jobs in qp_deps and
    qp_flow_jobs. How many jobs it held (0 if a lock was not free within LOCK_WAIT: the next pass finishes it)."""
    ids: Any = column("id")
    detached_jobs = table(jobs_name, ids, column("key"))
    try:
        with engine.begin() as conn:
            run(conn, f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
            count = conn.execute(select(func.count()).select_from(detached_jobs)).scalar_one()
            run(
                conn,
                f"DELETE FROM {KEYS} AS k USING {jobs_name} AS j WHERE j.key IS NOT NULL AND k.key = j.key "
                "AND k.job_id = j.id",
            )
            for name, key in (("qp_deps", "child_id"), ("qp_flow_jobs", "job_id")):
                named: Any = column(key)
                conn.execute(table(name, named).delete().where(named.in_(select(ids).select_from(detached_jobs))))
            for table_name, _ in TABLES:
                run(conn, f"DROP TABLE IF EXISTS {table_name}{jobs_name.removeprefix('qp_jobs')}")
    except OperationalError as error:
        if getattr(error.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            return 0
        raise
    return int(count)


def upkeep(engine: Engine, now: float) -> None:
    """Make the ranges wanted ahead (`now`: database time, the end of the day whose ids set their width): looked up
    without a lock, then again under a lock that only another upkeep waits for, and made each under its table's
    lock for a moment (a claim waits behind it); skipped if a lock is not free within LOCK_WAIT."""
    with engine.connect() as conn:
        wanted = ranges_wanted(conn, now)
        conn.rollback()
    if not wanted:
        return
    try:
        with engine.begin() as conn:
            run(conn, f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
            run(conn, "LOCK TABLE ONLY qp_jobs IN SHARE UPDATE EXCLUSIVE MODE")
            make_ranges(conn, ranges_wanted(conn, now))
    except OperationalError as error:
        if getattr(error.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise


def _jobs_by_range(_metadata: Any, connection: Any, tables: Any = (), **_: Any) -> None:
    """PostgreSQL: qp_jobs, qp_runs and qp_payloads, once made by create_all, are partitioned by range of job id
    (made here, where every store and migrations import it: schema cannot import this module, which builds on it)."""
    if connection.dialect.name == "postgresql" and schema.jobs in tables:
        partition_jobs(connection)


event.listen(schema.metadata, "after_create", _jobs_by_range)
