"""A farm database made by an older QueueProcessor is upgraded in place when a node starts, and goes on working."""

import threading
import uuid
from contextlib import contextmanager

import pytest
from sqlalchemy import Index, MetaData, exc, func, insert, inspect, select, text, true, update

from queueprocessor import JobFilter
from queueprocessor.farm import Farm
from queueprocessor.rules.errors import DuplicateKey
from queueprocessor.rules.job import JobSpec
from queueprocessor.rules.roster import KnownMachines
from queueprocessor.store import schema
from queueprocessor.store.database import open_engine
from queueprocessor.store.migrations import (
    FLOW_COLUMNS,
    PAYLOAD_INDEX_BEFORE_13,
    QUEUED_BEFORE_6,
    SCHEDULE_POLICY_COLUMNS,
)
from queueprocessor.store.sqlfunctions import FORMER_SIGNATURE, KEYED_SIGNATURE, SIGNATURE, create_sql_functions
from queueprocessor.store.types import ClaimRequest, Plan, Progress

JOB = JobSpec(executor="python", target="bench.jobs:noop", max_attempts=1)
CURRENT = str(schema.SCHEMA_VERSION)


def drop_column(conn, table: str, column: str) -> None:
    """A column an older version did not have, gone (SQLite drops a column's default with it; the others first
    need it dropped)."""
    if conn.dialect.name != "sqlite":
        conn.execute(text(f"ALTER TABLE {table} ALTER COLUMN {column} DROP DEFAULT"))
    conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))


def set_version(conn, version: int) -> None:
    conn.execute(update(schema.meta).where(schema.meta.c.key == "schema_version").values(value=str(version)))


def drop_index(conn, name: str, table: str = "qp_jobs") -> None:
    """SQL Server names the index's table too."""
    conn.execute(text(f"DROP INDEX {name}{f' ON {table}' if conn.dialect.name == 'mssql' else ''}"))


@contextmanager
def rewriting(url: str):
    """One transaction on the farm database at `url`, to make it as an older version left it."""
    engine = open_engine(url)
    try:
        with engine.begin() as conn:
            yield conn
    finally:
        engine.dispose()


def unpartitioned(conn, table) -> None:
    """PostgreSQL: `table` made again in one table, as schema 12 had it, with its rows and its id sequence."""
    name = table.name
    serial = text(f"SELECT pg_get_serial_sequence('{name}', 'id')")
    sequence = conn.execute(serial).scalar() if "id" in table.c else None
    if sequence:
        conn.execute(text(f"ALTER SEQUENCE {sequence} OWNED BY NONE"))
    conn.execute(text(f"CREATE TABLE {name}_flat (LIKE {name} INCLUDING DEFAULTS)"))
    conn.execute(text(f"INSERT INTO {name}_flat SELECT * FROM {name}"))
    conn.execute(text(f"DROP TABLE {name}"))
    conn.execute(text(f"ALTER TABLE {name}_flat RENAME TO {name}"))
    conn.execute(text(f"ALTER TABLE {name} ADD PRIMARY KEY ({', '.join(c.name for c in table.primary_key)})"))
    for index in table.indexes:
        index.create(conn)
    if sequence:
        conn.execute(text(f"ALTER SEQUENCE {sequence} OWNED BY {name}.id"))


def notify_each_insert(conn) -> None:
    """PostgreSQL: push as schema 12 had it, a NOTIFY for every insert statement into qp_jobs, no throttle row."""
    conn.execute(text("DROP TRIGGER qp_jobs_push ON qp_jobs"))
    conn.execute(text("DROP FUNCTION qp_push()"))
    conn.execute(text("DROP TABLE qp_push"))
    conn.execute(
        text(
            "CREATE OR REPLACE FUNCTION qp_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN PERFORM pg_notify('qp_jobs', ''); RETURN NULL; END $$"
        )
    )
    conn.execute(
        text(
            "CREATE TRIGGER qp_jobs_notify AFTER INSERT ON qp_jobs FOR EACH STATEMENT EXECUTE FUNCTION qp_jobs_notify()"
        )
    )


def back_to_16(conn) -> None:
    """Schema 17's trace context, gone: no traceparent on job rows, and on PostgreSQL qp_enqueue of thirteen
    parameters (a stand-in of that signature: what the upgrade does with it, not what it ran, is what is tested)."""
    drop_column(conn, "qp_jobs", "traceparent")
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"DROP FUNCTION {SIGNATURE}"))
        conn.execute(text(f"CREATE FUNCTION {KEYED_SIGNATURE} RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint'"))


def make_version_16(url: str) -> None:
    """A farm database as schema version 16 left it (see back_to_16)."""
    Farm(url).close()
    with rewriting(url) as conn:
        back_to_16(conn)
        set_version(conn, 16)


def back_to_15(conn) -> None:
    """Schema 16's keys on their own terms and schedule policies, gone: no scope or hold on job rows, none of the
    qp_schedules columns of overlap, jitter, pause until and pause on failure, and on PostgreSQL qp_enqueue of six
    parameters (a stand-in, as back_to_16's); and version 16's lacks (see back_to_16)."""
    back_to_16(conn)
    for column in ("key_scope", "key_hold"):
        drop_column(conn, "qp_jobs", column)
    for column in SCHEDULE_POLICY_COLUMNS:
        drop_column(conn, "qp_schedules", column)
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"DROP FUNCTION {KEYED_SIGNATURE}"))
        conn.execute(text(f"CREATE FUNCTION {FORMER_SIGNATURE} RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint'"))


def make_version_15(url: str) -> None:
    """A farm database as schema version 15 left it (see back_to_15)."""
    Farm(url).close()
    with rewriting(url) as conn:
        back_to_15(conn)
        set_version(conn, 15)


def back_to_14(conn) -> None:
    """Schema 15's flow control, gone: the jobs' fairness columns and their indexes, the claim's index of held-back
    queues in age order alone, the queues' settings of fair shares, of limits and rates per key, of breakers and
    adaptive rates, the buckets of rates per key; no count of snoozes on job rows, nor of snoozed runs in the
    history (and version 15's lacks: see back_to_15)."""
    back_to_15(conn)
    for index in ("ix_qp_jobs_vtag", "ix_qp_jobs_fair", "ix_qp_jobs_key_running", "ix_qp_jobs_gated"):
        drop_index(conn, index)
    older = schema.jobs.to_metadata(MetaData()).c  # a copy: an index made on it joins no table of the schema's
    gated = schema.QUEUED & (schema.jobs.c.gated == true())
    where = {f"{conn.dialect.name}_where": gated}
    Index("ix_qp_jobs_gated", older.queue, older.priority.desc(), older.run_at, older.id, **where).create(conn)
    for column in ("fair_key", "fair_weight", "cost", "vtag", "snoozes"):
        drop_column(conn, "qp_jobs", column)
    for column in ("fair", "key_limit", "fair_from", "key_rate_count", "key_rate_per", "key_burst"):
        drop_column(conn, "qp_queues", column)
    for column in FLOW_COLUMNS:
        drop_column(conn, "qp_queues", column)
    drop_column(conn, "qp_history", "snoozed")
    conn.execute(text("DROP TABLE qp_key_buckets"))


def make_version_14(url: str) -> None:
    """A farm database as schema version 14 left it: no flow control (see back_to_14)."""
    Farm(url).close()
    with rewriting(url) as conn:
        back_to_14(conn)
        set_version(conn, 14)


def make_version_13(url: str) -> None:
    """A farm database as schema version 13 left it: on PostgreSQL qp_jobs, qp_runs and qp_payloads in one table each,
    keys and running order keys unique by qp_jobs' own indexes, no side tables (and version 14's lacks: see
    back_to_14, undone last, as unpartitioned makes the indexes of today's columns)."""
    Farm(url).close()
    with rewriting(url) as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("DROP TABLE qp_job_keys, qp_running_order_keys"))
            conn.execute(text(f"CREATE TABLE flat (LIKE {schema.PAYLOADS})"))
            conn.execute(text(f"INSERT INTO flat SELECT * FROM {schema.PAYLOADS}"))
            conn.execute(text(f"DROP TABLE {schema.PAYLOADS}"))
            conn.execute(text(f"ALTER TABLE flat RENAME TO {schema.PAYLOADS}"))
            conn.execute(text(f"ALTER TABLE {schema.PAYLOADS} ADD PRIMARY KEY (job_id)"))
            unpartitioned(conn, schema.runs)
            unpartitioned(conn, schema.jobs)
            conn.execute(text("DROP FUNCTION qp_job_keys_kept(), qp_running_order_keys_kept()"))
            conn.execute(text(f"ALTER TABLE qp_jobs SET (fillfactor = {schema.JOBS_FILL})"))
            schema.keep_payloads_apart(conn)
            create_sql_functions(conn)
        back_to_14(conn)
        set_version(conn, 13)


def make_version_12(url: str) -> None:
    """A farm database as schema version 12 left it (as this version made it, whatever is in it already): machine
    rows without the roster version that last changed them, nor its index; no output on job rows nor index of
    succeeded jobs' ends; no retention of a queue's own; on PostgreSQL, job rows filling their pages and run rows
    leaving 30 % of theirs, the history and the event log in one table each, a NOTIFY for every insert statement
    instead of coalesced push, and payloads indexed on qp_jobs itself (no qp_payloads nor its triggers)."""
    make_version_13(url)
    with rewriting(url) as conn:
        drop_index(conn, "ix_qp_machines_changed", "qp_machines")
        drop_column(conn, "qp_machines", "changed")
        drop_index(conn, schema.SUCCEEDED_JOBS)
        drop_column(conn, "qp_jobs", "output")
        drop_column(conn, "qp_queues", "keep")
        if conn.dialect.name == "postgresql":
            conn.execute(text("ALTER TABLE qp_jobs RESET (fillfactor)"))
            conn.execute(text("ALTER TABLE qp_runs SET (fillfactor = 70)"))
            unpartitioned(conn, schema.history)
            unpartitioned(conn, schema.events)
            notify_each_insert(conn)
            for trigger in ("added", "changed", "gone"):
                conn.execute(text(f"DROP TRIGGER qp_payloads_{trigger} ON qp_jobs"))
            conn.execute(text("DROP FUNCTION qp_payloads_kept()"))
            conn.execute(text(f"DROP TABLE {schema.PAYLOADS}"))
            conn.execute(PAYLOAD_INDEX_BEFORE_13)
        set_version(conn, 12)


def make_version_11(url: str) -> None:
    """A farm database as schema version 11 left it (as this version made it, whatever is in it already): on
    SQLite, qp_jobs without AUTOINCREMENT (made again so, with its rows and indexes)."""
    make_version_12(url)
    with rewriting(url) as conn:
        if conn.dialect.name == "sqlite":
            made = conn.execute(
                text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'qp_jobs'")
            ).scalar()
            indexes = conn.execute(
                text("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'qp_jobs' AND sql IS NOT NULL")
            ).all()
            conn.execute(text(made.replace(" AUTOINCREMENT", "").replace("qp_jobs", "qp_jobs_old", 1)))
            conn.execute(text("INSERT INTO qp_jobs_old SELECT * FROM qp_jobs"))
            conn.execute(text("DROP TABLE qp_jobs"))
            conn.execute(text("ALTER TABLE qp_jobs_old RENAME TO qp_jobs"))
            for (index,) in indexes:
                conn.execute(text(index))
        set_version(conn, 11)


def make_version_10(url: str) -> None:
    """A farm database as schema version 10 left it: qp_enqueue as it was is made again by step 10 whatever it is
    (tests/contract/test_sql_enqueue_role.py peels that step off for real)."""
    make_version_11(url)
    with rewriting(url) as conn:
        set_version(conn, 10)


def make_version_9(url: str) -> None:
    """A farm database as schema version 9 left it (as this version made it, whatever is in it already): no
    history, and runs not indexed by their end."""
    make_version_10(url)
    with rewriting(url) as conn:
        conn.execute(text("DROP TABLE qp_history"))
        conn.execute(text("DROP TABLE qp_events"))
        drop_index(conn, "ix_qp_runs_finished", "qp_runs")
        set_version(conn, 9)


def make_version_8(url: str) -> None:
    """A farm database as schema version 8 left it: on PostgreSQL, no index (nor function) for payload searches."""
    make_version_9(url)
    with rewriting(url) as conn:
        if conn.dialect.name == "postgresql":
            drop_index(conn, "ix_qp_jobs_payload")
            conn.execute(text("DROP STATISTICS st_qp_jobs_payload"))
            conn.execute(text(f"DROP FUNCTION {schema.PAYLOAD_JSON}(text)"))
        set_version(conn, 8)


def make_version_7(url: str) -> None:
    """A farm database as schema version 7 left it (as this version made it, whatever is in it already): no progress
    on jobs and runs, no qp_enqueue."""
    make_version_8(url)
    with rewriting(url) as conn:
        for table in ("qp_jobs", "qp_runs"):
            for column in ("progress", "progress_message"):
                drop_column(conn, table, column)
        if conn.dialect.name in ("postgresql", "mssql"):
            conn.execute(text(f"DROP {'FUNCTION' if conn.dialect.name == 'postgresql' else 'PROCEDURE'} qp_enqueue"))
        set_version(conn, 7)


def make_version_6(url: str) -> None:
    """A farm database as schema version 6 left it: no dependencies, workflows or groups."""
    make_version_7(url)
    with rewriting(url) as conn:
        drop_index(conn, "ix_qp_jobs_held")
        for column in ("has_children", "pending", "held_by"):
            drop_column(conn, "qp_jobs", column)
        for table in ("qp_deps", "qp_flows", "qp_flow_jobs"):
            conn.execute(text(f"DROP TABLE {table}"))
        set_version(conn, 6)


def make_version_5(url: str) -> None:
    """A farm database as schema version 5 left it: no gated flag on jobs, and the claim's index holding every
    queued job."""
    make_version_6(url)
    with rewriting(url) as conn:
        drop_index(conn, "ix_qp_jobs_gated")
        drop_index(conn, "ix_qp_jobs_queued")
        conn.execute(QUEUED_BEFORE_6)
        drop_column(conn, "qp_jobs", "gated")
        set_version(conn, 5)


def make_version_4(url: str) -> int:
    """A farm database as schema version 4 left it: queue rows without their running count; with one job
    waiting in it. The id of that job."""
    with Farm(url) as farm:
        waiting = farm._store.jobs.enqueue(JOB)[0]
    make_version_5(url)
    with rewriting(url) as conn:
        drop_column(conn, "qp_queues", "running")
        set_version(conn, 4)
    return waiting


def make_version_3(url: str) -> int:
    """A farm database as schema version 3 left it: no roster version, machine rows without the heartbeat's
    indexes, packed full; with one job waiting in it. The id of that job."""
    waiting = make_version_4(url)
    with rewriting(url) as conn:
        for index in ("ix_qp_machines_seen", "ix_qp_machines_wished"):
            drop_index(conn, index, "qp_machines")
        if conn.dialect.name == "postgresql":
            conn.execute(text("ALTER TABLE qp_machines RESET (fillfactor)"))
        conn.execute(text("DROP TABLE qp_roster"))
        set_version(conn, 3)
    return waiting


def make_version_2(url: str) -> int:
    """A farm database as schema version 2 left it (version 3's, without named queues: no queue or order key on
    jobs and schedules, no served queues on machines, no qp_queues), with one job waiting in it. The id of that
    job."""
    waiting = make_version_3(url)
    with rewriting(url) as conn:
        drop_index(conn, "ix_qp_jobs_order")
        drop_index(conn, "ux_qp_jobs_order_running")
        for table, column in (
            ("qp_jobs", "queue"),
            ("qp_jobs", "order_key"),
            ("qp_schedules", "queue"),
            ("qp_schedules", "order_key"),
            ("qp_machines", "queues"),
        ):
            drop_column(conn, table, column)
        conn.execute(text("DROP TABLE qp_queues"))
        set_version(conn, 2)
    return waiting


def make_version_1(url: str) -> int:
    """A farm database as schema version 1 left it (version 2's, but its claim index held every job, state
    first; failed jobs had no index of their own), with one job waiting in it. The id of that job."""
    waiting = make_version_2(url)
    with rewriting(url) as conn:
        drop_index(conn, "ix_qp_jobs_queued")
        drop_index(conn, "ix_qp_jobs_ended_badly")
        conn.execute(text("CREATE INDEX ix_qp_jobs_queue ON qp_jobs (state, priority DESC, run_at, id)"))
        set_version(conn, 1)
    return waiting


def shape(farm: Farm) -> tuple[str, set[str]]:
    with farm._engine.connect() as conn:
        version = conn.execute(select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")).scalar()
        names = {index["name"] for index in inspect(conn).get_indexes("qp_jobs")}
        if conn.dialect.name == "postgresql":  # keys and running order keys unique through side tables (schema 14)
            sides = "SELECT indexname FROM pg_indexes WHERE tablename IN ('qp_job_keys', 'qp_running_order_keys')"
            names |= set(conn.execute(text(sides)).scalars())
        return version, names


def test_a_version_1_database_is_upgraded_as_a_node_starts_and_works(db_url):
    waiting = make_version_1(db_url)
    with Farm(db_url) as farm:
        version, indexes = shape(farm)
        assert version == CURRENT == "17"
        assert {"ix_qp_jobs_queued", "ix_qp_jobs_ended_badly"} <= indexes
        assert "ix_qp_jobs_queue" not in indexes

        store = farm._store
        fresh = store.jobs.enqueue(JOB)[0]
        me = store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=4)
        claimed = {job.id: job for job in store.jobs.claim(ClaimRequest(me, 4, 30.0))}
        assert set(claimed) == {waiting, fresh}, "the job from before the upgrade and a new one are claimed"
        assert store.jobs.claim(ClaimRequest(me, 4, 30.0)) == []
        assert store.runs.finish(claimed[waiting], me, "succeeded") == "succeeded"
        assert store.runs.finish(claimed[fresh], me, "failed", error="boom") == "failed"
        assert [job["id"] for job in store.jobs.newest("succeeded")] == [waiting]
        assert [job["id"] for job in store.jobs.newest("failed")] == [fresh]
        assert store.jobs.newest("queued") == []
        assert store.jobs.counts() == {
            "waiting": 0,
            "queued": 0,
            "running": 0,
            "succeeded": 1,
            "failed": 1,
            "cancelled": 0,
        }


def test_nodes_starting_together_upgrade_once(db_url):
    make_version_1(db_url)
    errors = []

    def start():
        try:
            Farm(db_url).close()
        except Exception as error:  # noqa: BLE001 - reported below, the test's own thread
            errors.append(error)

    starters = [threading.Thread(target=start, name="qp-test-start") for _ in range(3)]
    for starter in starters:
        starter.start()
    for starter in starters:
        starter.join()
    assert errors == []
    with Farm(db_url) as farm:
        version, indexes = shape(farm)
    assert version == CURRENT and "ix_qp_jobs_queue" not in indexes and "ix_qp_jobs_queued" in indexes


def test_a_version_2_database_gets_named_queues_in_place(db_url):
    """Version 2 to 3: the job already waiting lands in `default`, the new columns work, and queues run."""
    waiting = make_version_2(db_url)
    with Farm(db_url) as farm:
        version, indexes = shape(farm)
        assert version == CURRENT and {"ix_qp_jobs_order", "ux_qp_jobs_order_running"} <= indexes
        assert farm._store.jobs.get(waiting)["queue"] == "default"
        ordered = farm._store.jobs.enqueue(
            JobSpec("python", "bench.jobs:noop", queue="reports", order_key="k"), count=2
        )
        me = farm._store.machines.register(
            name="m", host="h", instance="m-1", pid=1, version="t", capacity=4, queues="reports"
        )
        farm.pause_queue("reports")
        assert farm._store.jobs.claim(ClaimRequest(me, 4, 30.0, plan=Plan(served=("reports",)))) == []
        farm.resume_queue("reports")
        [first] = farm._store.jobs.claim(ClaimRequest(me, 4, 30.0, plan=Plan(served=("reports",))))
        assert first.id == ordered[0], "the oldest of the key, and only it"
        assert [(q.name, q.waiting, q.running, q.order_keys_waiting) for q in farm.queues()] == [
            ("default", 1, 0, 0),
            ("reports", 1, 1, 1),
        ]


def test_a_version_3_database_gets_the_roster_version_and_the_heartbeat_indexes_in_place(db_url):
    """Version 3 to 4: qp_roster appears and counts from the first change; machine rows get their indexes (and,
    on PostgreSQL, their fill factor); a heartbeat reads through them."""
    make_version_3(db_url)
    with Farm(db_url) as farm:
        version, _ = shape(farm)
        with farm._engine.connect() as conn:
            indexes = {index["name"] for index in inspect(conn).get_indexes("qp_machines")}
            fill = (
                conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'qp_machines'")).scalar()
                if farm._engine.dialect.name == "postgresql"
                else None
            )
        assert version == CURRENT and {"ix_qp_machines_seen", "ix_qp_machines_wished"} <= indexes
        assert fill in (None, [f"fillfactor={schema.MACHINES_FILL}"])
        assert farm._engine.dialect.name != "postgresql" or fill is not None
        peers = farm._store.roster
        me = farm._store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=4)
        read = peers.read_farm(me, before=farm._store.ask_time() - 60)
        assert read.version == 1 and read.suspects == {}


def test_a_version_4_database_counts_the_running_jobs_of_its_limited_queues_in_place(db_url):
    """Version 4 to 5: queue rows get their running count, counted for the queues limited already, so a limit
    holds across the upgrade: 2 of a limit of 3 were running, one more starts."""
    with Farm(db_url) as farm:
        farm._store.jobs.enqueue(JobSpec("python", "bench.jobs:noop", queue="reports"), count=4)
        farm.set_queue("reports", limit=3)
        me = farm._store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=4)
        guarded = Plan(served=("reports",), alone=(("reports", 4, True),))
        assert len(farm._store.jobs.claim(ClaimRequest(me, 2, 30.0, plan=guarded))) == 2
    make_version_4(db_url)
    with Farm(db_url) as farm:
        version, _ = shape(farm)
        running = farm._store.rows(select(schema.queues.c.running).where(schema.queues.c.name == "reports"))
        assert version == CURRENT and running == [(2,)]
        assert len(farm._store.jobs.claim(ClaimRequest(me, 4, 30.0, plan=guarded))) == 1


def test_a_version_5_database_gates_the_jobs_of_its_held_back_queues_in_place(db_url):
    """Version 5 to 6: the waiting jobs of a paused queue and of a limited one are gated as the node starts, so the
    main claim passes them by and each is claimed through its own queue's branch: the limited queue's within its
    limit, the paused queue's once it is resumed. Jobs of other queues are not gated."""
    with Farm(db_url) as farm:
        plain = farm._store.jobs.enqueue(JOB, count=2)
        farm._store.jobs.enqueue(JobSpec("python", "bench.jobs:noop", queue="reports"), count=3)
        farm._store.jobs.enqueue(JobSpec("python", "bench.jobs:noop", queue="mail"), count=2)
    make_version_5(db_url)
    with Farm(db_url) as farm:
        farm.set_queue("reports", limit=2)  # pause and limit as a version 5 farm left them: rows only
    make_version_5(db_url)
    with rewriting(db_url) as conn:
        conn.execute(update(schema.queues).where(schema.queues.c.name == "reports").values(running=0))
        conn.execute(  # the columns of version 5's row (the schema's own would add later ones)
            text(
                "INSERT INTO qp_queues (name, paused, running, on_failure, changed_at) "
                "VALUES ('mail', :paused, 0, 'skip', 0)"
            ),
            dict(paused=True),
        )
    with Farm(db_url) as farm:
        version, indexes = shape(farm)
        assert version == CURRENT and {"ix_qp_jobs_queued", "ix_qp_jobs_gated"} <= indexes
        gated = dict(
            farm._store.rows(
                select(
                    schema.jobs.c.queue,
                    func.bool_and(schema.jobs.c.gated)
                    if farm._engine.dialect.name == "postgresql"
                    else func.min(schema.jobs.c.gated),
                ).group_by(schema.jobs.c.queue)
            )
        )
        assert {queue: bool(flag) for queue, flag in gated.items()} == {"default": False, "reports": True, "mail": True}
        me = farm._store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=8)
        assert sorted(c.id for c in farm._store.jobs.claim(ClaimRequest(me, 8, 30.0))) == plain
        guarded = Plan(alone=(("reports", 8, True),))
        assert [c.queue for c in farm._store.jobs.claim(ClaimRequest(me, 8, 30.0, plan=guarded))] == [
            "reports",
            "reports",
        ]
        farm.resume_queue("mail")
        assert [c.queue for c in farm._store.jobs.claim(ClaimRequest(me, 8, 30.0))] == ["mail", "mail"]


def test_a_version_6_database_gets_dependencies_in_place(db_url):
    """Version 6 to 7: jobs get the dependency columns, and the new tables are made; a job from before the upgrade
    can be named as a parent, and its success releases its child."""
    with Farm(db_url) as farm:
        farm._store.jobs.enqueue(JOB)
    make_version_6(db_url)
    with Farm(db_url) as farm:
        version, indexes = shape(farm)
        assert version == CURRENT and "ix_qp_jobs_held" in indexes
        store = farm._store
        [old] = [job["id"] for job in store.jobs.newest("queued")]
        [child] = store.jobs.enqueue(JobSpec("python", "bench.jobs:noop", after=(old,)))
        assert store.jobs.get(child)["state"] == "waiting"
        me = store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=4)
        [claimed] = store.jobs.claim(ClaimRequest(me, 4, 30.0))
        assert store.runs.finish(claimed, me, "succeeded") == "succeeded"
        assert store.jobs.get(child)["state"] == "queued"


def test_a_version_7_database_gets_progress_in_place(db_url):
    """Version 7 to 8: jobs and runs get their progress columns (a job waiting from before reports progress once
    claimed, and its run keeps it), and PostgreSQL gets qp_enqueue."""
    with Farm(db_url) as farm:
        [waiting] = farm._store.jobs.enqueue(JOB)
    make_version_7(db_url)
    with Farm(db_url) as farm:
        store = farm._store
        assert shape(farm)[0] == CURRENT
        me = store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=4)
        [job] = store.jobs.claim(ClaimRequest(me, 1, 30.0))
        assert job.id == waiting
        store.runs.renew(me, [(job.id, job.fence)], 30.0, {(job.id, job.fence): Progress(0.5, "half")})
        store.runs.finish(job, me, "succeeded")
        [run] = store.runs.read(job_id=waiting)
        assert (run["progress"], run["progress_message"]) == (0.5, "half")
        if farm._engine.dialect.name == "postgresql":  # and the database's own door to the queue (sqlfunctions)
            with farm._engine.begin() as conn:
                sql = conn.execute(text("SELECT qp_enqueue('python', 'bench.jobs:noop')")).scalar_one()
            assert farm.job(sql)["state"] == "queued"


def test_a_version_8_database_gets_the_payload_search_index_in_place(db_url):
    """Version 8 to 9: payload fields are searched, on PostgreSQL through an index of its own."""
    make_version_8(db_url)
    with rewriting(db_url) as conn:  # rows an older node wrote, one of them not JSON (a plain SQL insert)
        for payload in ('{"day": "monday"}', "not JSON"):
            conn.execute(
                insert(schema.jobs).values(executor="http", target="/t", payload=payload, run_at=0, created_at=0)
            )
    with Farm(db_url) as farm:
        version, indexes = shape(farm)
        assert version == CURRENT
        assert "ix_qp_jobs_payload" not in indexes  # PostgreSQL: its index went with the payloads' own table (13)
        [found] = farm.find_jobs(JobFilter(search="day=monday"))
        assert found["payload"] == '{"day": "monday"}'


def test_a_version_9_database_gets_the_farms_history_in_place(db_url):
    """Version 9 to 10: the history table and the runs' index by their end are made as the node starts, and the
    minute's writer counts the runs that ended before the upgrade."""
    with Farm(db_url) as farm:
        me = farm._store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=8)
        farm._store.jobs.enqueue(JOB)
        [claimed] = farm._store.jobs.claim(ClaimRequest(me, 8, 30.0))
        farm._store.runs.finish(claimed, me, "succeeded")
    make_version_9(db_url)
    with Farm(db_url) as farm:
        with farm._engine.connect() as conn:
            indexes = {index["name"] for index in inspect(conn).get_indexes("qp_runs")}
        assert shape(farm)[0] == CURRENT and "ix_qp_runs_finished" in indexes
        [ended] = farm._store.runs.read()
        minute = int(ended["finished_at"] // 60 * 60)
        assert farm._store.stats.write_minute(minute) == 1
        [row] = farm._store.stats.read(3600)
        assert (row["enqueued"], row["started"], row["succeeded"]) == (1, 1, 1)


def newest_deleted_then_enqueued(farm: Farm) -> tuple[int, int]:
    """Enqueue a job, end it, delete it (the newest), enqueue another: (the deleted job's id, the new one's)."""
    [gone] = farm._store.jobs.enqueue(JOB)
    assert farm.cancel(gone) == "cancelled"
    assert farm.delete_jobs(JobFilter(ids=(gone,))) == 1
    [new] = farm._store.jobs.enqueue(JOB)
    return gone, new


def test_a_deleted_newest_jobs_id_is_never_given_again(farm):
    """SQLite gave the next job the id of the newest one deleted (rowid: max + 1), whose fences start at 1 again:
    a target that keeps the highest fence it saw per job would refuse it. No backend reuses an id."""
    gone, new = newest_deleted_then_enqueued(farm)
    assert new > gone


def test_a_version_11_database_never_reuses_a_job_id_once_upgraded(db_url):
    """Version 11 to 12: on SQLite qp_jobs is made again with AUTOINCREMENT as the node starts, its rows and
    indexes kept; from then on a deleted newest job's id is not given again."""
    with Farm(db_url) as farm:
        [kept] = farm._store.jobs.enqueue(JOB)
    make_version_11(db_url)
    with Farm(db_url) as farm:
        assert shape(farm)[0] == CURRENT
        assert farm.job(kept)["state"] == "queued"
        assert {index.name for index in schema.jobs.indexes} <= shape(farm)[1]
        gone, new = newest_deleted_then_enqueued(farm)
        assert gone > kept and new > gone


def test_a_version_12_database_marks_each_roster_change_on_its_row_in_place(db_url):
    """Version 12 to 13: machine rows get the version that last changed them (0 for those already there) and its
    index; from then on a node reads only the rows changed since its version, and a change an older node makes
    (a bump written on no row) sends it back to reading every row."""
    with Farm(db_url) as farm:
        old, older = (
            farm._store.machines.register(name=name, host="h", instance=name, pid=1, version="t", capacity=4)
            for name in ("old", "older")
        )
    make_version_12(db_url)
    with Farm(db_url) as farm:
        store, peers = farm._store, farm._store.roster
        assert shape(farm)[0] == CURRENT
        with farm._engine.connect() as conn:
            assert "ix_qp_machines_changed" in {index["name"] for index in inspect(conn).get_indexes("qp_machines")}
        version, rows = peers.read_all()
        assert [(row["id"], row["changed"]) for row in rows] == [(old, 0), (older, 0)]
        known = KnownMachines()
        known.replace(version, rows, before=0.0)
        new = store.machines.register(name="new", host="h", instance="m-1", pid=1, version="t", capacity=4)
        behind = known.behind(peers.read_farm(new, before=0.0).version)
        assert behind == (version, 2)
        assert known.catch_up(*peers.read_changes(*behind), 0.0, {})
        assert sorted(row["id"] for row in known.machines()) == [old, older, new]
        with farm._engine.begin() as conn:  # what a node of version 12 does as it stops
            conn.execute(update(schema.machines).where(schema.machines.c.id == old).values(state="stopped"))
            conn.execute(update(schema.roster_version).values(version=schema.roster_version.c.version + 1))
        version, changed = peers.read_changes(known.version, 2)
        assert changed == [] and not known.catch_up(version, changed, 0.0, {}), "a version on no row: read all"


def fill_factors(farm: Farm) -> dict[str, list[str] | None]:
    with farm._engine.connect() as conn:
        # the jobs of schema 13 and before: the first partition of qp_jobs since schema 14 (store/job_partitions.py)
        rows = conn.execute(
            text(
                "SELECT relname, reloptions FROM pg_class WHERE relkind IN ('r', 'p') "
                "AND (relname IN ('qp_jobs', 'qp_runs') OR relname LIKE 'qp\\_jobs\\_below\\_%')"
            )
        )
        found = {name: options for name, options in rows}
        first = [options for name, options in found.items() if name.startswith("qp_jobs_below_")]
        return {"qp_jobs": first[0] if first else found.get("qp_jobs"), "qp_runs": found.get("qp_runs")}


def test_a_version_12_database_gives_job_rows_room_in_place(db_url):
    """Version 12 to 13: on PostgreSQL job rows get half a page (schema.JOBS_FILL) and run rows fill theirs; a run
    claimed before the upgrade ends after it, recorded once."""
    with Farm(db_url) as farm:
        me = farm._store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=8)
        farm._store.jobs.enqueue(JOB)
        [claimed] = farm._store.jobs.claim(ClaimRequest(me, 8, 30.0))
        made = fill_factors(farm) if farm._store.dialect == "postgresql" else None
    make_version_12(db_url)
    with Farm(db_url) as farm:
        assert shape(farm)[0] == CURRENT
        if farm._store.dialect == "postgresql":
            assert fill_factors(farm) == made == {"qp_jobs": [f"fillfactor={schema.JOBS_FILL}"], "qp_runs": None}
        assert farm._store.runs.finish(claimed, me, "succeeded") == "succeeded"
        assert [run["outcome"] for run in farm._store.runs.read(job_id=claimed.id)] == ["succeeded"]


def test_a_success_an_older_node_recorded_beside_an_upgraded_one_is_read_once(db_url):
    """Version 13 keeps a success on its job's row; a node of version 12 still running writes its row in qp_runs
    too (the same job and fence), as it always did: every reader of runs reads it once, with its output."""
    make_version_12(db_url)
    with Farm(db_url) as farm:
        assert shape(farm)[0] == CURRENT
        store = farm._store
        me = store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=8)
        store.jobs.enqueue(JOB, count=2)
        older, newer = store.jobs.claim(ClaimRequest(me, 8, 30.0))
        with farm._engine.begin() as conn:  # the older node's finish: the job's row, then its run's row
            conn.execute(
                update(schema.jobs)
                .where(schema.jobs.c.id == older.id)
                .values(state="succeeded", lease_until=None, finished_at=schema.jobs.c.started_at + 1)
            )
            conn.execute(
                insert(schema.runs).from_select(
                    ["job_id", "attempt", "machine_id", "fence", "started_at", "finished_at", "outcome", "output"],
                    select(
                        schema.jobs.c.id,
                        schema.jobs.c.attempts,
                        schema.jobs.c.owner,
                        schema.jobs.c.fence,
                        schema.jobs.c.started_at,
                        schema.jobs.c.finished_at,
                        text("'succeeded'"),
                        text("'old'"),
                    ).where(schema.jobs.c.id == older.id),
                )
            )
        assert store.runs.finish(newer, me, "succeeded", output="new") == "succeeded"
        with farm._engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(schema.runs)).scalar() == 1
        for job, output in ((older, "old"), (newer, "new")):
            [run] = store.runs.read(job_id=job.id)
            assert (run["outcome"], run["output"], run["fence"], run["machine_name"]) == ("succeeded", output, 1, "m")
        everything = store.runs.read()
        assert sorted(run["job_id"] for run in everything) == sorted([older.id, newer.id])
        assert store.views.machine_throughput(0, 2**40) == {me: {"succeeded": 2}}


def partitioned(farm: Farm) -> set[str]:
    """The farm's tables that are partitioned (PostgreSQL)."""
    with farm._engine.connect() as conn:
        return set(conn.execute(text("SELECT relname FROM pg_class WHERE relkind = 'p'")).scalars())


def test_a_version_12_database_gets_its_logs_by_day_and_a_queues_own_retention_in_place(db_url):
    """Version 12 to 13: on PostgreSQL the history and the event log are made again partitioned by day, their
    rows kept and the event ids going on from the last; every backend: a queue may keep its finished jobs for a
    time of its own."""
    with Farm(db_url) as farm:
        farm._store.jobs.enqueue(JobSpec(executor="python", target="bench.jobs:noop", queue="reports"))
        farm.set_queue("reports", limit=2)
        farm.set_queue("reports", on_failure="block")
        assert farm._store.stats.write_minute(int(farm._store.ask_time() // 60 * 60)) == 1
        logged = [e["id"] for e in farm.events()]
    make_version_12(db_url)
    with rewriting(db_url) as conn:
        if conn.dialect.name == "postgresql":
            assert not conn.execute(text("SELECT relname FROM pg_class WHERE relkind = 'p'")).all()
    with Farm(db_url) as farm:
        assert shape(farm)[0] == CURRENT
        if farm._store.dialect == "postgresql":
            assert {"qp_events", "qp_history"} <= partitioned(farm)
        assert [e["id"] for e in farm.events()] == logged
        assert [row["waiting"] for row in farm._store.stats.read(3600)] == [1]
        farm.set_queue("reports", keep="3d")
        assert farm.queue("reports").keep == 3 * 86400
        [*old, new] = [e["id"] for e in farm.events()]
        assert old == logged and new > max(logged)


def payload_rows(farm: Farm) -> dict[int, str]:
    with farm._engine.connect() as conn:
        return dict(conn.execute(text(f"SELECT job_id, doc::text FROM {schema.PAYLOADS}")).all())


def test_a_version_12_database_keeps_its_payloads_apart_in_place_and_an_older_nodes_writes_follow(db_url):
    """Version 12 to 13: on PostgreSQL the payloads there are copied into their own table, searched there, and the
    job rows lose their index; what a node of 12 still writes to qp_jobs afterwards (an enqueue, a new payload, a
    prune) the side table follows, so no payload is missed by a search. Elsewhere the payload is searched on the row."""
    make_version_12(db_url)
    with rewriting(db_url) as conn:  # rows a node of 12 wrote, one of them not JSON (a plain SQL insert)
        for payload in ('{"day": "monday"}', "not JSON", None):
            conn.execute(
                insert(schema.jobs).values(executor="http", target="/t", payload=payload, run_at=0, created_at=0)
            )
    with Farm(db_url) as farm:
        version, indexes = shape(farm)
        assert version == CURRENT and "ix_qp_jobs_payload" not in indexes
        [before] = farm.find_jobs(JobFilter(search="day=monday"))
        with farm._engine.begin() as conn:  # what a node of 12 still does beside it, by its own statements
            later = conn.execute(
                insert(schema.jobs)
                .values(executor="http", target="/t", payload='{"day": "tuesday"}', run_at=0, created_at=0)
                .returning(schema.jobs.c.id)
            ).scalar_one()
            friday = update(schema.jobs).where(schema.jobs.c.id == before["id"]).values(payload='{"day": "friday"}')
            conn.execute(friday)
        assert [job["id"] for job in farm.find_jobs(JobFilter(search="day=tuesday"))] == [later]
        assert [job["id"] for job in farm.find_jobs(JobFilter(search="day=friday"))] == [before["id"]]
        assert farm.find_jobs(JobFilter(search="day=monday")) == []
        if farm._store.dialect == "postgresql":
            assert payload_rows(farm) == {before["id"]: '{"day": "friday"}', later: '{"day": "tuesday"}'}
            with farm._engine.begin() as conn:
                conn.execute(schema.jobs.delete().where(schema.jobs.c.id == later))
            assert list(payload_rows(farm)) == [before["id"]]


def test_a_version_13_database_gets_its_jobs_by_range_in_place_with_every_row_and_key(db_url):
    """PostgreSQL: qp_jobs, qp_runs and qp_payloads become partitioned by range of job id, each old table the first
    partition with all its rows; keys stay unique farm-wide through the side table, filled from the rows."""
    make_version_13(db_url)
    with rewriting(
        db_url
    ) as conn:  # a version 13 farm's jobs: queued and keyed, failed with a run and a payload, running
        made = [
            conn.execute(
                insert(schema.jobs)
                .values(executor="http", target="/x", run_at=0, created_at=0, state=state, key=key, payload=payload)
                .returning(schema.jobs.c.id)
            ).scalar_one()
            for state, key, payload in (("queued", "k-1", None), ("failed", None, '{"a": 1}'), ("running", "k-2", None))
        ]
        conn.execute(
            insert(schema.runs).values(
                job_id=made[1], attempt=1, machine_id=1, fence=1, started_at=0, finished_at=1, outcome="failed"
            )
        )
    with Farm(db_url) as farm:
        jobs = {job["id"]: job for job in farm._store.jobs.newest()}
        assert set(made) <= set(jobs), "every job kept"
        assert {run["job_id"] for run in farm._store.runs.read()} == {
            made[1],
            made[2],
        }  # the running one's run: its row
        with pytest.raises(DuplicateKey):
            farm.enqueue(farm.http_spec("/y", key="k-1"))
        with pytest.raises(DuplicateKey):
            farm.enqueue(farm.http_spec("/y", key="k-2"))
        [new] = farm.enqueue(farm.http_spec("/z", key="k-3"))
        assert new > max(made)
        with farm._engine.connect() as conn:
            version = conn.execute(text("SELECT value FROM qp_meta WHERE key = 'schema_version'")).scalar()
            if farm._engine.dialect.name == "postgresql":
                kinds = dict(
                    conn.execute(
                        text(
                            "SELECT relname, relkind FROM pg_class "
                            "WHERE relname IN ('qp_jobs', 'qp_runs', 'qp_payloads')"
                        )
                    ).all()
                )
                assert kinds == {"qp_jobs": "p", "qp_runs": "p", "qp_payloads": "p"}
                keys = dict(conn.execute(text("SELECT key, job_id FROM qp_job_keys")).all())
                assert keys == {"k-1": made[0], "k-2": made[2], "k-3": new}
                payloads = conn.execute(text("SELECT job_id FROM qp_payloads")).scalars().all()
                assert payloads == [made[1]]
        assert version == str(schema.SCHEMA_VERSION)


def test_a_version_14_database_gets_fair_shares_and_limits_per_key_in_place(db_url):
    with Farm(db_url) as farm:
        [waiting] = farm._store.jobs.enqueue(JobSpec(executor="python", target="bench.jobs:noop", queue="t"))
        farm.set_queue("t", limit=5)  # held back before the upgrade: its job is gated
    make_version_14(db_url)
    with Farm(db_url) as farm:
        version, indexes = shape(farm)
        assert version == CURRENT
        assert {"ix_qp_jobs_gated", "ix_qp_jobs_vtag", "ix_qp_jobs_fair", "ix_qp_jobs_key_running"} <= indexes
        farm.set_queue("t", fair=True, key_limit=1)
        assert farm.job(waiting)["state"] == "queued" and farm.job(waiting)["vtag"] is not None, "tagged in place"
        me = farm._store.machines.register(name="m", host="h", instance="i", pid=1, version="t", capacity=8)
        plan = Plan(alone=(("t", 8, True),), keyed=("t",))
        assert [job.id for job in farm._store.jobs.claim(ClaimRequest(me, 8, 30.0, plan=plan))] == [waiting]


def test_a_version_14_database_counts_snoozes_in_place_and_an_older_nodes_history_follows(db_url):
    """Version 14 to 15: job rows get their count of snoozes (NULL, none yet) and the history its count of snoozed
    runs, 0 in the rows already there and in those an older node writes without it; a job of before snoozes."""
    with Farm(db_url) as farm:
        me = farm._store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=8)
        [job_id] = farm._store.jobs.enqueue(JOB)
        [claimed] = farm._store.jobs.claim(ClaimRequest(me, 8, 30.0))
        farm._store.runs.finish(claimed, me, "succeeded")
        minute = int(farm._store.runs.read()[0]["finished_at"] // 60 * 60)
        assert farm._store.stats.write_minute(minute) == 1
        [older] = farm._store.jobs.enqueue(JOB)
    make_version_14(db_url)
    with rewriting(db_url) as conn:  # a minute an older node wrote, without the count it does not know
        conn.execute(
            text(
                "INSERT INTO qp_history (queue, step, at, enqueued, started, succeeded, failed, timeout, cancelled, "
                "lost, last_job) VALUES ('default', 60, 0, 1, 0, 0, 0, 0, 0, 0, 1)"
            )
        )
    with Farm(db_url) as farm:
        assert shape(farm)[0] == CURRENT
        assert (farm.job(job_id)["snoozes"], farm.job(older)["snoozes"]) == (None, None)
        with farm._engine.connect() as conn:
            assert set(conn.execute(text("SELECT snoozed FROM qp_history")).scalars()) == {0}
        me = farm._store.machines.register(name="n", host="h", instance="n-1", pid=1, version="t", capacity=8)
        [claimed] = farm._store.jobs.claim(ClaimRequest(me, 8, 30.0))
        ending = farm._store.runs.finish(claimed, me, "snoozed", error="later", retry_in=0.0)
        assert (ending, farm.job(older)["snoozes"], farm.job(older)["attempts"]) == ("queued", 1, 0)


def test_a_version_14_database_gets_breakers_and_adaptive_rates_in_place(db_url):
    make_version_14(db_url)
    with rewriting(db_url) as conn:
        conn.execute(  # the columns of version 14's row (the schema's own would add later ones)
            text(
                "INSERT INTO qp_queues (name, paused, max_running, running, on_failure, changed_at) "
                "VALUES ('api', :paused, 2, 0, 'skip', 0)"
            ),
            dict(paused=False),
        )
    with Farm(db_url) as farm:
        [job] = farm.enqueue(farm.http_spec("/x", queue="api"))
        assert farm.queue("api").limit == 2 and farm.queue("api").breaker is None, "its settings kept, no breaker"
        farm.set_queue("api", breaker="2/60s", rate="5/s", adaptive="1/s")
        info = farm.queue("api")
        assert (info.breaker, info.breaker_state, str(info.rate), info.adaptive_floor) == (
            "2/60s",
            "closed",
            "5/s",
            1.0,
        )
        me = farm._store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=4)
        assert [
            c.id for c in farm._store.jobs.claim(ClaimRequest(me, 4, 30.0, plan=Plan(alone=(("api", 4, True),))))
        ] == [job]


def test_a_version_15_database_gets_keys_on_their_own_terms_and_its_sql_door_keeps_its_callers(db_url):
    """Version 15 to 16: job rows get their key's scope and hold (NULL: held while kept, as every job before); on
    PostgreSQL qp_enqueue takes a key and its terms, the six-parameter one is gone, and a role granted it keeps
    the door."""
    with Farm(db_url) as farm:
        [before] = farm._store.jobs.enqueue(JobSpec(executor="python", target="bench.jobs:noop", key="k"))
    make_version_15(db_url)
    postgresql, writer = db_url.startswith("postgresql"), f"writer_{uuid.uuid4().hex[:8]}"  # roles are the server's
    if postgresql:
        with rewriting(db_url) as conn:
            conn.execute(text(f"CREATE ROLE {writer} NOLOGIN"))
            conn.execute(text(f"GRANT EXECUTE ON FUNCTION {FORMER_SIGNATURE} TO {writer}"))
    with Farm(db_url) as farm:
        assert shape(farm)[0] == CURRENT
        spec = farm.python_spec("bench.jobs:noop", key="k", on_conflict="existing")
        assert farm.submit(spec).ids == [before], "a job of before holds its key as it did"
        if postgresql:
            with farm._engine.begin() as conn:
                door = "SELECT to_regprocedure(:f) IS NULL, has_function_privilege(:w, :s, 'EXECUTE')"
                assert conn.execute(text(door), dict(f=FORMER_SIGNATURE, s=SIGNATURE, w=writer)).one() == (True, True)
                keyed = text("SELECT qp_enqueue('python', 'bench.jobs:noop', key => 'k', on_conflict => 'existing')")
                assert conn.execute(keyed).scalar() == before


def test_a_version_15_database_gets_schedule_policies_in_place_and_an_older_nodes_schedule_follows(db_url):
    """Version 15 to 16: every schedule there is `allow` with no jitter and none of the rest, as before; one an older
    node adds afterwards (naming only version 15's columns) is too; and a policy can be set at once."""
    with Farm(db_url) as farm:
        farm.schedule("before", farm.python_spec("tests.support.pyjobs:noop"), every=3600)
    make_version_15(db_url)
    with Farm(db_url) as farm:
        assert shape(farm)[0] == CURRENT
        with farm._engine.begin() as conn:  # an older node's add: the columns it knows
            row = {c: v for c, v in farm.get_schedule("before").items() if c not in (*SCHEDULE_POLICY_COLUMNS, "id")}
            columns = ", ".join(row)  # in SQL: the schema's table would fill the new columns' Python defaults
            conn.execute(
                text(f"INSERT INTO qp_schedules ({columns}) VALUES (:{', :'.join(row)})"), row | dict(name="older")
            )
        for name in ("before", "older"):
            row = farm.get_schedule(name)
            assert (row["overlap"], row["jitter"]) == ("allow", 0.0)
            assert all(row[c] is None for c in SCHEDULE_POLICY_COLUMNS if c not in ("overlap", "jitter"))
        assert farm.edit_schedule("before", overlap="skip", pause_on_failure=2)["overlap"] == "skip"


def test_a_version_16_database_keeps_trace_context_and_its_sql_door_keeps_its_callers(db_url):
    """Version 16 to 17: job rows get a traceparent (NULL on every job there is); on PostgreSQL qp_enqueue takes one
    last, the thirteen-parameter one is gone, a role granted it keeps the door, and a malformed one is refused."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with Farm(db_url) as farm:
        [before] = farm._store.jobs.enqueue(JobSpec(executor="python", target="bench.jobs:noop"))
    make_version_16(db_url)
    postgresql, writer = db_url.startswith("postgresql"), f"writer_{uuid.uuid4().hex[:8]}"  # roles are the server's
    if postgresql:
        with rewriting(db_url) as conn:
            conn.execute(text(f"CREATE ROLE {writer} NOLOGIN"))
            conn.execute(text(f"GRANT EXECUTE ON FUNCTION {KEYED_SIGNATURE} TO {writer}"))
    with Farm(db_url) as farm:
        assert shape(farm)[0] == CURRENT
        [after] = farm.submit(farm.python_spec("bench.jobs:noop", traceparent=traceparent.upper())).ids
        assert [farm._store.jobs.traceparents([before, after])] == [{after: traceparent}], "none on a job of before"
        if postgresql:
            with farm._engine.begin() as conn:
                door = "SELECT to_regprocedure(:f) IS NULL, has_function_privilege(:w, :s, 'EXECUTE')"
                assert conn.execute(text(door), dict(f=KEYED_SIGNATURE, s=SIGNATURE, w=writer)).one() == (True, True)
                traced = text("SELECT qp_enqueue('python', 'bench.jobs:noop', traceparent => :t)")
                job_id = conn.execute(traced, dict(t=traceparent)).scalar()
                blank = conn.execute(traced, dict(t="")).scalar()  # as an unset setting of the caller's gives
            assert farm._store.jobs.traceparents([job_id, blank]) == {job_id: traceparent}
            with pytest.raises(exc.DBAPIError, match="traceparent '00-xyz' is not a W3C traceparent") as refused:
                with farm._engine.begin() as conn:
                    conn.execute(traced, dict(t="00-xyz"))
            assert refused.value.orig.sqlstate == "22023"
