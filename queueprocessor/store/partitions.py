"""Day partitions on PostgreSQL for the farm's logs that grow without bound (docs/design.md §11): qp_events and
qp_history are partitioned by range of `at`, a day each (UTC), with a default partition so an insert never fails.

Retention drops a day whole once all of it is past its keep, instead of deleting its rows: a drop writes no dead
row for autovacuum to find and costs the same whatever the day held (rows are kept at least `keep` seconds, at most
a day longer). The chore runs where the history's hourly roll-up does, once an hour for the whole farm
(TurnTimer._write_history); it makes the days ahead too, so the default partition stays empty unless the chore
stalls for days. A row that lands there anyway moves into its day's partition when that day is made. SQLite and SQL
Server keep one table each, trimmed by DELETE.

Table names are the schema's own constants and partition names are made from them and a date: never input.
"""

from datetime import UTC, datetime

from sqlalchemy import Table, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

DAY = 86400
AHEAD = 2  # days made beyond today's
LOCK_WAIT = "2s"  # a drop waits this long for the readers of the table; failing that, the next hour tries again
LOCK_NOT_AVAILABLE = "55P03"


def _name(table: str, day: int) -> str:
    """The partition of `table` for the day that starts at `day` (epoch seconds): qp_events_20250114."""
    return f"{table}_{datetime.fromtimestamp(day, UTC):%Y%m%d}"


def _day_of(table: str, name: str) -> int | None:
    """The start of the day partition `name` of `table` holds (None: the default partition)."""
    stamp = name.removeprefix(f"{table}_")
    if not stamp.isdigit():
        return None
    return int(datetime.strptime(stamp, "%Y%m%d").replace(tzinfo=UTC).timestamp())


def _days(conn: Connection, table: str) -> set[int]:
    """The days `table` has a partition for."""
    names = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = CAST(:t AS regclass)"
        ),
        dict(t=table),
    ).scalars()
    return {day for name in names if (day := _day_of(table, name)) is not None}


def _make_day(conn: Connection, table: str, day: int) -> None:
    """A partition for the day at `day`, with whatever rows the default partition holds of it moved in first (a
    partition over rows of the default cannot be attached)."""
    name = _name(table, day)
    conn.execute(text(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS)"))
    conn.execute(
        text(
            f"WITH moved AS (DELETE FROM {table}_default WHERE at >= {day} AND at < {day + DAY} RETURNING *) "
            f"INSERT INTO {name} SELECT * FROM moved"
        )
    )
    conn.execute(text(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ({day}) TO ({day + DAY})"))


def partition(conn: Connection, table: Table) -> None:
    """Make `table` (made unpartitioned by create_all, or by an older schema, with rows) partitioned by day of
    `at`, in the caller's transaction: renamed, made again partitioned with its key extended by `at` (a
    partitioned table's key must hold the partition key) and its indexes, a partition for each day it has rows of
    and for the days ahead, its rows copied, the old table dropped. Its id sequence, if any, goes with the new
    table. Nothing to do if it is partitioned already (made so by create_all within an older schema's step)."""
    name, old = table.name, f"{table.name}_unpartitioned"
    if conn.execute(text(f"SELECT relkind FROM pg_class WHERE oid = '{name}'::regclass")).scalar() == "p":
        return
    conn.execute(text(f"ALTER TABLE {name} RENAME TO {old}"))
    conn.execute(text(f"ALTER TABLE {old} DROP CONSTRAINT {name}_pkey"))
    for index in table.indexes:
        conn.execute(text(f"DROP INDEX {index.name}"))
    serials = [
        (column.name, sequence)
        for column in table.primary_key
        if (sequence := conn.execute(text(f"SELECT pg_get_serial_sequence('{old}', '{column.name}')")).scalar())
    ]
    for _, sequence in serials:
        conn.execute(text(f"ALTER SEQUENCE {sequence} OWNED BY NONE"))
    key = [column.name for column in table.primary_key] + ([] if "at" in table.primary_key.columns else ["at"])
    made = f"CREATE TABLE {name} (LIKE {old} INCLUDING DEFAULTS, PRIMARY KEY ({', '.join(key)}))"
    conn.execute(text(f"{made} PARTITION BY RANGE (at)"))
    for index in table.indexes:
        index.create(conn)
    conn.execute(text(f"CREATE TABLE {name}_default PARTITION OF {name} DEFAULT"))
    held = conn.execute(text(f"SELECT DISTINCT floor(at / {DAY}) * {DAY} FROM {old}")).scalars()
    now = conn.execute(text("SELECT extract(epoch FROM now())")).scalar_one()
    for day in sorted({int(day) for day in held} | _ahead(float(now))):
        _make_day(conn, name, day)
    conn.execute(text(f"INSERT INTO {name} SELECT * FROM {old}"))
    conn.execute(text(f"DROP TABLE {old}"))
    for column, sequence in serials:
        conn.execute(text(f"ALTER SEQUENCE {sequence} OWNED BY {name}.{column}"))


def _ahead(now: float) -> set[int]:
    """Today's day and AHEAD more."""
    today = int(now // DAY * DAY)
    return {today + n * DAY for n in range(AHEAD + 1)}


def upkeep(engine: Engine, table: str, now: float, keep: float) -> int:
    """Make `table`'s days ahead and drop the days wholly older than `keep` seconds before `now` (database time),
    with the rows of the default partition past it, in one transaction; how many rows went. Serialised by a lock
    on `table` that every upkeep takes (and inserts do not wait for); a drop holds the table alone for a moment.
    0 and nothing done if it could not have it within LOCK_WAIT (a long read of it: the next hour tries again)."""
    try:
        with engine.begin() as conn:
            conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'"))
            conn.execute(text(f"LOCK TABLE ONLY {table} IN SHARE UPDATE EXCLUSIVE MODE"))
            days = _days(conn, table)
            for day in sorted(_ahead(now) - days):
                _make_day(conn, table, day)
            gone = conn.execute(text(f"DELETE FROM {table}_default WHERE at < :cut"), dict(cut=now - keep)).rowcount
            for day in sorted(day for day in days if day + DAY <= now - keep):
                partition_name = _name(table, day)
                gone += conn.execute(text(f"SELECT count(*) FROM {partition_name}")).scalar_one()
                conn.execute(text(f"DROP TABLE {partition_name}"))
            return int(gone)
    except OperationalError as error:
        if getattr(error.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            return 0
        raise
