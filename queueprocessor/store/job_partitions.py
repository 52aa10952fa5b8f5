"""Finished jobs pruned by partition on PostgreSQL (docs/design.md §11): qp_jobs is partitioned by range of id, a
range of ID_SPAN ids per day of enqueue, and qp_runs and qp_payloads by the same ranges of job_id, so a day goes
with everything that hangs off it, dropped whole once every job in it has finished and passed its queue's keep.

A job's partition is fixed when it is inserted: its id is drawn from the one sequence, which the housekeeping moves
to the base of each day's range as the day starts (upkeep, `setval`, forward only), so no claim, renewal or finish
ever moves a row to another partition, and each of them, and every look-up by id, prunes to one partition by the
primary key. Days are made AHEAD; a late chore only lets the current range go on filling (2^36 ids), and an id
outside every range (given by hand) lands in the default partition, so no insert fails. The ids of a day start at
(day - 2000-01-01) * 2^36, under 2^53 (exact as a JavaScript number) until the 24th century. The table an older
schema made becomes the first partition, every id below today's range (`qp_jobs_until_YYYYMMDD`).

A partitioned table's unique index must hold its partition key, so two farm-wide rules move to side tables kept by
triggers that fire only for the rows they concern: a job's key, unique while its row is kept (qp_job_keys, whose
key is named ux_qp_jobs_key: a duplicate enqueue fails as it always did), and the running job of an order key, one
at a time (qp_running_order_keys, ux_qp_jobs_order_running). A dropped partition fires no trigger: its drop deletes
its keys itself. SQLite and SQL Server keep one table, pruned by DELETE (JobStore.prune).
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DDL, ColumnElement, and_, column, event, exists, false, literal_column, or_, select, table, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from ..rules.queues import MAX_NAME, MAX_ORDER_KEY
from ..rules.states import JobState
from . import schema
from .partitions import DAY, LOCK_NOT_AVAILABLE

ID_SPAN = 2**36  # ids a day: 800,000 jobs a second for a day before a range spills into the next
EPOCH = 946684800  # 2000-01-01: day 0 of the ranges
AHEAD = 2  # days made beyond today's
LOCK_WAIT = "200ms"  # a drop holds qp_jobs alone for a moment: every claim waits behind it, so it waits little
KEYS = "qp_job_keys"
RUNNING_ORDER_KEYS = "qp_running_order_keys"
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


def base(day: int) -> int:
    """The first id of the day that starts at `day` (epoch seconds)."""
    return (day - EPOCH) // DAY * ID_SPAN


def day_name(table_name: str, day: int) -> str:
    return f"{table_name}_{datetime.fromtimestamp(day, UTC):%Y%m%d}"


@dataclass(frozen=True)
class Part:
    """One partition of qp_jobs: its ids [lo, hi) (lo None: every id below hi) and the time its range closed (its
    day's end; the first partition's: the day the table was partitioned)."""

    day: int
    lo: int | None

    @property
    def hi(self) -> int:
        return base(self.day + (DAY if self.lo is not None else 0))

    @property
    def closed(self) -> int:
        return self.day + (DAY if self.lo is not None else 0)

    def name(self, table_name: str) -> str:
        return day_name(table_name, self.day) if self.lo is not None else day_name(f"{table_name}_until", self.day)


def _ddl(conn: Connection, statement: str) -> None:
    conn.execute(DDL(statement.replace("%", "%%")))


def _quoted(conn: Connection, name: str) -> str:
    return str(conn.dialect.identifier_preparer.quote(name))


def parts(conn: Connection) -> list[Part]:
    """qp_jobs' partitions by day, oldest first (not the default)."""
    names = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'qp_jobs'::regclass"
        )
    ).scalars()
    found = []
    for name in names:
        stamp = name.removeprefix("qp_jobs_").removeprefix("until_")
        if stamp.isdigit():
            day = int(datetime.strptime(stamp, "%Y%m%d").replace(tzinfo=UTC).timestamp())
            found.append(Part(day, None if name.startswith("qp_jobs_until_") else base(day)))
    return sorted(found, key=lambda part: part.hi)


def side_ddl(farm_schema: str) -> str:
    """The side tables that keep keys and running order keys unique farm-wide, and their triggers' function."""
    s = '"' + farm_schema.replace('"', '""') + '"'
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
    return f"""
CREATE TRIGGER qp_job_keys_added AFTER INSERT ON qp_jobs
FOR EACH ROW WHEN (NEW.key IS NOT NULL) EXECUTE FUNCTION qp_job_keys_kept();
CREATE TRIGGER qp_job_keys_changed AFTER UPDATE OF key ON qp_jobs
FOR EACH ROW WHEN (OLD.key IS DISTINCT FROM NEW.key) EXECUTE FUNCTION qp_job_keys_kept();
CREATE TRIGGER qp_job_keys_gone AFTER DELETE ON qp_jobs
FOR EACH ROW WHEN (OLD.key IS NOT NULL) EXECUTE FUNCTION qp_job_keys_kept();
CREATE TRIGGER qp_running_order_keys_added AFTER INSERT ON qp_jobs
FOR EACH ROW WHEN {running.format("NEW")} EXECUTE FUNCTION qp_running_order_keys_kept();
CREATE TRIGGER qp_running_order_keys_changed AFTER UPDATE OF state, queue, order_key ON qp_jobs
FOR EACH ROW WHEN ({moved}) EXECUTE FUNCTION qp_running_order_keys_kept();
CREATE TRIGGER qp_running_order_keys_gone AFTER DELETE ON qp_jobs
FOR EACH ROW WHEN {running.format("OLD")} EXECUTE FUNCTION qp_running_order_keys_kept();
"""


def _parent_indexes(conn: Connection, table_name: str) -> None:
    """The indexes of the partitioned `table_name`, cloned to every partition (an equal one there is taken as is)."""
    if table_name == schema.PAYLOADS:
        _ddl(conn, f"ALTER TABLE {table_name} ADD PRIMARY KEY (job_id)")
        _ddl(conn, f"CREATE INDEX {schema.PAYLOADS_INDEX} ON {table_name} USING gin (doc jsonb_path_ops)")
        return
    whole = schema.jobs if table_name == "qp_jobs" else schema.runs
    for index in whole.indexes:
        if index.name not in UNIQUE:
            index.create(conn)
    if whole is schema.jobs:
        _ddl(conn, "ALTER TABLE qp_jobs ADD PRIMARY KEY (id)")
        for definition in PLAIN.values():
            _ddl(conn, definition)


def _into_first_partition(conn: Connection, table_name: str, key: str, first: Part) -> None:
    """Make `table_name` (plain, with rows) partitioned by range of `key`, itself its first partition: every id
    below `first.hi`. Its indexes are renamed and kept (equal to the new table's, they are attached as they are,
    unbuilt), a CHECK validated first spares ATTACH its scan, its sequence and its grants go to the new table."""
    old = first.name(table_name)
    _ddl(conn, f"ALTER TABLE {table_name} RENAME TO {old}")
    indexes = conn.execute(
        text("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = CAST(:t AS regclass)"), dict(t=old)
    ).scalars()
    for index_name in list(indexes):
        _ddl(conn, f"ALTER INDEX {index_name} RENAME TO {_quoted(conn, old + '_' + index_name.removeprefix('ux_'))}")
    _ddl(conn, f"CREATE TABLE {table_name} (LIKE {old} INCLUDING DEFAULTS) PARTITION BY RANGE ({key})")
    if table_name != schema.PAYLOADS:  # the others take their ids from a sequence of their own
        serial = conn.execute(text("SELECT pg_get_serial_sequence(:t, 'id')"), dict(t=old)).scalar()
        _ddl(conn, f"ALTER SEQUENCE {serial} OWNED BY {table_name}.id")
    grants = conn.execute(
        text(
            "SELECT a.privilege_type, CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END "
            "FROM pg_class c, aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee "
            "WHERE c.oid = CAST(:t AS regclass) AND a.grantee <> c.relowner"
        ),
        dict(t=old),
    ).all()
    for privilege, grantee in grants:
        _ddl(conn, f"GRANT {privilege} ON {table_name} TO {grantee}")
    _parent_indexes(conn, table_name)
    _ddl(conn, f"ALTER TABLE {old} ADD CONSTRAINT {old}_ids CHECK ({key} < {first.hi}) NOT VALID")
    _ddl(conn, f"ALTER TABLE {old} VALIDATE CONSTRAINT {old}_ids")
    _ddl(conn, f"ALTER TABLE {table_name} ATTACH PARTITION {old} FOR VALUES FROM (MINVALUE) TO ({first.hi})")
    _ddl(conn, f"ALTER TABLE {old} DROP CONSTRAINT {old}_ids")
    for unique in UNIQUE:
        _ddl(conn, f"DROP INDEX IF EXISTS {old}_{unique.removeprefix('ux_')}")
    _ddl(conn, f"CREATE TABLE {table_name}_default PARTITION OF {table_name} DEFAULT{_fill(table_name)}")


def _fill(table_name: str) -> str:
    return f" WITH (fillfactor = {schema.JOBS_FILL})" if table_name == "qp_jobs" else ""


def _now(conn: Connection) -> float:
    return float(conn.execute(text("SELECT extract(epoch FROM now())")).scalar_one())


def partition_jobs(conn: Connection) -> None:
    """Make a plain qp_jobs, qp_runs and qp_payloads (new and empty, or an older schema's with rows) partitioned by
    day of job id, in the caller's transaction: each the first partition of its new table, the side tables filled
    from the rows there, the triggers on the new qp_jobs, today's and the next days' partitions made and the
    sequence moved to today's range. Nothing to do if qp_jobs is partitioned already."""
    kind = text("SELECT relkind FROM pg_class WHERE oid = 'qp_jobs'::regclass")
    if conn.execute(kind).scalar() == "p":
        return
    today = int(_now(conn) // DAY * DAY)
    _ddl(conn, "LOCK TABLE qp_jobs, qp_runs IN ACCESS EXCLUSIVE MODE")
    last = conn.execute(
        text("SELECT greatest((SELECT max(id) FROM qp_jobs), (SELECT last_value FROM qp_jobs_id_seq))")
    ).scalar_one()
    first = Part(max(today, (last // ID_SPAN + 1) * DAY + EPOCH), None)  # every id given so far below its top
    for trigger in TRIGGERS_BEFORE:
        _ddl(conn, f"DROP TRIGGER IF EXISTS {trigger} ON qp_jobs")
    for table_name, key in TABLES:
        _into_first_partition(conn, table_name, key, first)
    farm_schema: str = conn.execute(select(literal_column("current_schema()"))).scalar_one()
    _ddl(conn, side_ddl(farm_schema))
    _ddl(conn, f"INSERT INTO {KEYS} (key, job_id) SELECT key, id FROM qp_jobs WHERE key IS NOT NULL")
    _ddl(
        conn,
        f"INSERT INTO {RUNNING_ORDER_KEYS} (queue, order_key, job_id) SELECT queue, order_key, id FROM qp_jobs "
        "WHERE state = 'running' AND order_key IS NOT NULL",
    )
    _ddl(conn, _side_triggers())
    schema.keep_payloads_apart(conn)  # its triggers again, on the new qp_jobs (its table is made already)
    make_days(conn, today)


def make_days(conn: Connection, now: float) -> None:
    """Today's partitions and AHEAD more (those missing), and the sequence moved to today's range if behind it.
    A day whose range holds rows in the default partition (ids given by hand) is left unmade: they stay there."""
    today = int(now // DAY * DAY)
    made = parts(conn)
    top = made[-1].hi if made else None
    for day in range(today, today + (AHEAD + 1) * DAY, DAY):
        part = Part(day, base(day))
        if top is not None and part.lo is not None and part.lo < top:
            continue
        held = conn.execute(
            text("SELECT EXISTS (SELECT FROM qp_jobs_default WHERE id >= :lo AND id < :hi)"),
            dict(lo=part.lo, hi=part.hi),
        ).scalar_one()
        if held:
            break
        for table_name, _ in TABLES:
            _ddl(
                conn,
                f"CREATE TABLE {part.name(table_name)} PARTITION OF {table_name} "
                f"FOR VALUES FROM ({part.lo}) TO ({part.hi}){_fill(table_name)}",
            )
        top = part.hi
    start = base(today)
    if top is not None and start < top:
        conn.execute(
            text("SELECT setval('qp_jobs_id_seq', :start) FROM qp_jobs_id_seq WHERE last_value < :start"),
            dict(start=start),
        )


def closed_before(conn: Connection, now: float | None = None) -> Callable[[float], ColumnElement[bool]]:
    """For a keep (seconds), the jobs whose partition closed that long ago or more, or that are in none: what the
    DELETE path may prune of a queue kept so long (a younger day waits to go whole). `now`: database time."""
    jobs = schema.jobs
    now, made = _now(conn) if now is None else now, parts(conn)

    def below(keep: float) -> ColumnElement[bool]:
        closed = [part.hi for part in made if part.closed <= now - keep]
        inside = jobs.c.id < closed[-1] if closed else false()
        return or_(inside, jobs.c.id >= made[-1].hi) if made else inside

    return below


def _pinned(part: Part, past_keep: ColumnElement[bool], latest: Any) -> Any:
    """Whether `part` holds a job that is not finished, or not past its keep: each by an index of the state it asks
    of (the queued, the running, the failed or cancelled, the succeeded by end), fast under the table's lock."""
    jobs = schema.jobs
    ids = [jobs.c.id < part.hi] + ([jobs.c.id >= part.lo] if part.lo is not None else [])
    finished_young = ~past_keep
    asks = [
        and_(jobs.c.state == JobState.QUEUED, jobs.c.gated.is_(False)),
        and_(jobs.c.state == JobState.QUEUED, jobs.c.gated.is_(True)),
        jobs.c.state == JobState.RUNNING,
        and_(jobs.c.state.in_((JobState.FAILED, JobState.CANCELLED)), finished_young),
        and_(jobs.c.state == JobState.SUCCEEDED, jobs.c.finished_at >= latest, finished_young),
    ]
    return or_(*(exists().where(*ids, ask) for ask in asks))


def drop_days(engine: Engine, now: float, keep: float, kept: dict[str, float], past_keep: ColumnElement[bool]) -> int:
    """Drop every partition of qp_jobs (with its runs' and payloads') closed more than the shortest keep ago whose
    every job has finished and passed its keep (`past_keep`), with its keys and its rows of qp_deps and
    qp_flow_jobs; how many jobs went. Checked first without a lock, then again, by index, under the lock on qp_jobs
    that DETACH takes (waiting LOCK_WAIT at most: a long read of qp_jobs puts the drop off to the next pass)."""
    keeps = [keep, *kept.values()]
    latest = now - max(keeps)
    gone = 0
    with engine.connect() as conn:
        candidates = [part for part in parts(conn)[:-1] if part.closed <= now - min(keeps)]
        droppable = [part for part in candidates if not conn.execute(select(_pinned(part, past_keep, latest))).scalar()]
        conn.rollback()
    for part in droppable:
        try:
            with engine.begin() as conn:
                _ddl(conn, f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                _ddl(conn, "LOCK TABLE qp_jobs, qp_runs, qp_payloads IN ACCESS EXCLUSIVE MODE")
                if conn.execute(select(_pinned(part, past_keep, latest))).scalar():
                    continue
                gone += _drop(conn, part)
        except OperationalError as error:
            if getattr(error.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                return gone
            raise
    return gone


def _drop(conn: Connection, part: Part) -> int:
    """Detach and drop `part` of each table; first delete its keys from the side table (a drop fires no trigger) and
    the rows naming its jobs in qp_deps and qp_flow_jobs."""
    jobs_part = part.name("qp_jobs")
    count = conn.execute(text(f"SELECT count(*) FROM {jobs_part}")).scalar_one()
    _ddl(
        conn,
        f"DELETE FROM {KEYS} AS k USING {jobs_part} AS j WHERE j.key IS NOT NULL AND k.key = j.key AND k.job_id = j.id",
    )
    for name, key in (("qp_deps", "child_id"), ("qp_flow_jobs", "job_id")):
        ids: Any = column(key)
        which = [ids < part.hi] + ([ids >= part.lo] if part.lo is not None else [])
        conn.execute(table(name, ids).delete().where(*which))
    for table_name, _ in TABLES:
        name = part.name(table_name)
        _ddl(conn, f"ALTER TABLE {table_name} DETACH PARTITION {name}")
        _ddl(conn, f"DROP TABLE {name}")
    return int(count)


def upkeep(engine: Engine, now: float) -> None:
    """Make the days ahead and move the sequence to today's range: under a lock on qp_jobs that only another upkeep
    waits for (inserts do not), in one transaction; skipped if that lock is not free within LOCK_WAIT."""
    try:
        with engine.begin() as conn:
            _ddl(conn, f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
            _ddl(conn, "LOCK TABLE ONLY qp_jobs IN SHARE UPDATE EXCLUSIVE MODE")
            make_days(conn, now)
    except OperationalError as error:
        if getattr(error.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise


def _jobs_by_day(_metadata: Any, connection: Any, tables: Any = (), **_: Any) -> None:
    """PostgreSQL: qp_jobs, qp_runs and qp_payloads, once made by create_all, are partitioned by day of job id (made
    here, where every store and migrations import it: schema cannot import this module, which builds on it)."""
    if connection.dialect.name == "postgresql" and schema.jobs in tables:
        partition_jobs(connection)


event.listen(schema.metadata, "after_create", _jobs_by_day)
