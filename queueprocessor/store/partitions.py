"""Day partitions on PostgreSQL for the farm's logs that grow without bound (docs/design.md §11): qp_events and
qp_history are partitioned by range of `at`, a day each (UTC), with a default partition so an insert never fails.

Retention drops a day whole once all of it is past its keep, instead of deleting its rows: a drop writes no dead
row for autovacuum to find and costs the same whatever the day held (rows are kept at least `keep` seconds, at most
a day longer). The chore runs where the history's hourly roll-up does, once an hour for the whole farm
(TurnTimer._write_history); it makes the days ahead too, so the default partition stays empty unless the chore
stalls for days. A row that lands there anyway moves into its day's partition when that day is made. SQLite and SQL
Server keep one table each, trimmed by DELETE.

Table names are the schema's own constants and partition names are made from them and a date: never input. Still,
every value travels as a bound parameter, and the names in statements that cannot take one (DDL) are quoted.
"""

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DDL, Insert, Table, column, delete, func, insert, inspect, select, table, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.sql.expression import TableClause

DAY = 86400
AHEAD = 2  # days made beyond today's
LOCK_WAIT = "2s"  # a drop waits this long for the readers of the table; failing that, the next hour tries again
LOCK_NOT_AVAILABLE = "55P03"


def _name(table_name: str, day: int) -> str:
    """The partition of `table_name` for the day that starts at `day` (epoch seconds): qp_events_20250114."""
    return f"{table_name}_{datetime.fromtimestamp(day, UTC):%Y%m%d}"


def _day_of(table_name: str, name: str) -> int | None:
    """The start of the day partition `name` of `table_name` holds (None: the default partition)."""
    stamp = name.removeprefix(f"{table_name}_")
    if not stamp.isdigit():
        return None
    return int(datetime.strptime(stamp, "%Y%m%d").replace(tzinfo=UTC).timestamp())


def _ddl(conn: Connection, statement: str, **names: str) -> None:
    """Run DDL `statement` with each `{name}` in it the quoted identifier `names[name]` (DDL takes no parameters)."""
    quote = conn.dialect.identifier_preparer.quote
    conn.execute(DDL(statement.format(**{key: quote(value) for key, value in names.items()})))


def _like(whole: Table, name: str, there: set[str] | None = None) -> TableClause:
    """Table `name`, with `whole`'s columns (a partition of it, or the table it was; those in `there`, if given: a
    table an older schema made lacks a later step's)."""
    return table(name, *(column(c.name, c.type) for c in whole.c if there is None or c.name in there))


def _copy(whole: Table, source: Any, into: str, there: set[str] | None = None) -> Insert:
    """INSERT INTO `into` every row of `source`, both with `whole`'s columns (those in `there`, as _like)."""
    names = [c.name for c in whole.c if there is None or c.name in there]
    return insert(_like(whole, into)).from_select(names, select(*(source.c[n] for n in names)))


def _days(conn: Connection, table_name: str) -> set[int]:
    """The days `table_name` has a partition for."""
    names = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = CAST(:t AS regclass)"
        ),
        dict(t=table_name),
    ).scalars()
    return {day for name in names if (day := _day_of(table_name, name)) is not None}


def _make_day(conn: Connection, whole: Table, day: int, there: set[str] | None = None) -> None:
    """A partition of `whole` (with the columns `there`, as _like) for the day at `day`, with whatever rows the
    default partition holds of it moved in first (a partition over rows of the default cannot be attached)."""
    table_name = whole.name
    name = _name(table_name, day)
    _ddl(conn, "CREATE TABLE {day} (LIKE {table} INCLUDING DEFAULTS)", day=name, table=table_name)
    default = _like(whole, f"{table_name}_default", there)
    ofday = (default.c.at >= day) & (default.c.at < day + DAY)
    moved = delete(default).where(ofday).returning(*default.c).cte("moved")
    conn.execute(_copy(whole, moved, into=name, there=there).add_cte(moved))
    _ddl(
        conn,
        f"ALTER TABLE {{table}} ATTACH PARTITION {{day}} FOR VALUES FROM ({int(day)}) TO ({int(day) + DAY})",
        table=table_name,
        day=name,
    )


def partition(conn: Connection, whole: Table) -> None:
    """Make `whole` (made unpartitioned by create_all, or by an older schema, with rows) partitioned by day of
    `at`, in the caller's transaction: renamed, made again partitioned with its key extended by `at` (a
    partitioned table's key must hold the partition key) and its indexes, a partition for each day it has rows of
    and for the days ahead, its rows copied, the old table dropped. Its id sequence, if any, goes with the new
    table. Nothing to do if it is partitioned already (made so by create_all within an older schema's step)."""
    name, old = whole.name, f"{whole.name}_unpartitioned"
    kind = text("SELECT relkind FROM pg_class WHERE oid = CAST(:t AS regclass)")
    if conn.execute(kind, dict(t=name)).scalar() == "p":
        return
    _ddl(conn, "ALTER TABLE {table} RENAME TO {old}", table=name, old=old)
    _ddl(conn, "ALTER TABLE {old} DROP CONSTRAINT {key}", old=old, key=f"{name}_pkey")
    for index in whole.indexes:
        _ddl(conn, "DROP INDEX {index}", index=str(index.name))
    serial = text("SELECT pg_get_serial_sequence(:t, :c)")
    serials = [
        (column_.name, sequence)
        for column_ in whole.primary_key
        if (sequence := conn.execute(serial, dict(t=old, c=column_.name)).scalar())
    ]
    for _, sequence in serials:  # pg_get_serial_sequence gives it quoted as needed, qualified by its schema
        conn.execute(DDL(f"ALTER SEQUENCE {sequence} OWNED BY NONE"))
    key = [column_.name for column_ in whole.primary_key] + ([] if "at" in whole.primary_key.columns else ["at"])
    columns = ", ".join(conn.dialect.identifier_preparer.quote(column_name) for column_name in key)
    _ddl(
        conn,
        f"CREATE TABLE {{table}} (LIKE {{old}} INCLUDING DEFAULTS, PRIMARY KEY ({columns})) PARTITION BY RANGE (at)",
        table=name,
        old=old,
    )
    for index in whole.indexes:
        index.create(conn)
    _ddl(conn, "CREATE TABLE {default} PARTITION OF {table} DEFAULT", default=f"{name}_default", table=name)
    there = {c["name"] for c in inspect(conn).get_columns(old)}
    was = _like(whole, old, there)
    held = select(func.floor(was.c.at / DAY) * DAY).distinct()
    now = conn.execute(text("SELECT extract(epoch FROM now())")).scalar_one()
    for day in sorted({int(day) for day in conn.execute(held).scalars()} | _ahead(float(now))):
        _make_day(conn, whole, day, there)
    conn.execute(_copy(whole, was, into=name, there=there))
    _ddl(conn, "DROP TABLE {old}", old=old)
    for column_name, sequence in serials:
        owner = conn.dialect.identifier_preparer.quote
        conn.execute(DDL(f"ALTER SEQUENCE {sequence} OWNED BY {owner(name)}.{owner(column_name)}"))


def _ahead(now: float) -> set[int]:
    """Today's day and AHEAD more."""
    today = int(now // DAY * DAY)
    return {today + n * DAY for n in range(AHEAD + 1)}


def upkeep(engine: Engine, whole: Table, now: float, keep: float) -> int:
    """Make `whole`'s days ahead and drop the days wholly older than `keep` seconds before `now` (database
    time), with the rows of the default partition past it, in one transaction; how many rows went. Serialised by a
    lock on the table that every upkeep takes (and inserts do not wait for); a drop holds the table alone for a
    moment. 0 and nothing done if it could not have it within LOCK_WAIT (a long read of it: the next hour tries
    again)."""
    table_name = whole.name
    try:
        with engine.begin() as conn:
            conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'"))
            _ddl(conn, "LOCK TABLE ONLY {table} IN SHARE UPDATE EXCLUSIVE MODE", table=table_name)
            days = _days(conn, table_name)
            for day in sorted(_ahead(now) - days):
                _make_day(conn, whole, day)
            default = _like(whole, f"{table_name}_default")
            gone = conn.execute(delete(default).where(default.c.at < now - keep)).rowcount
            for day in sorted(day for day in days if day + DAY <= now - keep):
                partition_name = _name(table_name, day)
                gone += conn.execute(select(func.count()).select_from(table(partition_name))).scalar_one()
                _ddl(conn, "DROP TABLE {day}", day=partition_name)
            return int(gone)
    except OperationalError as error:
        if getattr(error.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            return 0
        raise
