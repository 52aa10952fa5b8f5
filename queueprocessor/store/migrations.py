"""Upgrades a farm database made by an older QueueProcessor to this one's schema, in place, as a node starts.

One step per schema version. The first node to start with newer code locks the version row, runs the
steps and bumps the version, all in one transaction; a node starting beside it waits for that lock and
then finds nothing left to do. Nodes still running the older code go on working: a step only adds
indexes, tables, and columns with a server default (so an older node's inserts still fill them), or, on SQLite,
makes a table again with the same columns.
"""

from typing import Any

from sqlalchemy import DDL, Column, Index, MetaData, String, Table, inspect, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.schema import CreateColumn, CreateTable

from . import schema
from .job_partitions import partition_jobs
from .partitions import partition
from .sql.gates import recount_statement, regate_statements
from .sqlfunctions import create_sql_functions, narrow_enqueuers

# What steps 1 to 2 and 5 to 6 need of an older qp_jobs, apart from the current tables (an index made on them would join
# the current schema).
_VERSION_1_JOBS = Table("qp_jobs", MetaData(), Column("state", String(16)))
# The claim's index of versions 2 to 5, which held every queued job.
QUEUED_BEFORE_6 = DDL("CREATE INDEX ix_qp_jobs_queued ON qp_jobs (priority DESC, run_at, id) WHERE state = 'queued'")


def _index_queued_jobs_only(conn: Connection) -> None:
    """1 to 2: the claim's index holds queued jobs only, so a claim and a finish add no entry to it, and
    failed or cancelled jobs get one of their own for look-ups by state (it held every job before)."""
    conn.execute(QUEUED_BEFORE_6)
    for index in schema.jobs.indexes:
        if index.name == "ix_qp_jobs_ended_badly":
            index.create(conn, checkfirst=True)
    Index("ix_qp_jobs_queue", _VERSION_1_JOBS.c.state).drop(conn, checkfirst=True)


def _add_column(conn: Connection, column: Column[Any]) -> None:
    """ALTER TABLE ... ADD one column of the current schema; its server default fills the rows already there.
    Table and column names are the schema's own constants, never input."""
    definition = CreateColumn(column).compile(dialect=conn.dialect)
    add = "ADD" if conn.dialect.name == "mssql" else "ADD COLUMN"
    conn.execute(DDL(f"ALTER TABLE {column.table.name} {add} {definition}"))


def _named_queues(conn: Connection) -> None:
    """2 to 3: named queues (docs/design.md §9). Jobs and schedules get a queue (every existing one is in `default`) and
    an order key, machines the queues they serve; qp_queues (made by create_all) holds operators' settings."""
    for column in (
        schema.jobs.c.queue,
        schema.jobs.c.order_key,
        schema.schedules.c.queue,
        schema.schedules.c.order_key,
        schema.machines.c.queues,
    ):
        _add_column(conn, column)
    for index in schema.jobs.indexes:
        if index.name in ("ix_qp_jobs_order", "ux_qp_jobs_order_running"):
            index.create(conn, checkfirst=True)
    schema.queues.create(conn, checkfirst=True)


def _heartbeat_reads(conn: Connection) -> None:
    """3 to 4: the heartbeat reads O(1) rows (store/roster.py). qp_roster (made by create_all) holds the roster
    version; machine rows get the indexes the read uses and, on PostgreSQL, room enough for it to use them."""
    schema.roster_version.create(conn, checkfirst=True)
    for index in schema.machines.indexes:
        if index.name in ("ix_qp_machines_seen", "ix_qp_machines_wished"):
            index.create(conn, checkfirst=True)
    if conn.dialect.name == "postgresql":
        conn.execute(DDL(f"ALTER TABLE qp_machines SET (fillfactor = {schema.MACHINES_FILL})"))


def _running_counts(conn: Connection) -> None:
    """4 to 5: a limited queue's row counts its running jobs (docs/design.md §9), counted here for the queues limited
    already. A node of version 4 still running starts jobs without counting them (it counts the running jobs
    themselves): the next housekeeping pass counts again (QueueStore.recount). (A database older than 3 has
    its qp_queues made whole by step 2.)"""
    if "running" not in {column["name"] for column in inspect(conn).get_columns("qp_queues")}:
        _add_column(conn, schema.queues.c.running)
    conn.execute(recount_statement())


def _gated_jobs(conn: Connection) -> None:
    """5 to 6: the queued jobs of held-back queues (paused, limited, rated) are gated (docs/design.md §9) and kept in an
    index of their own, out of the claim's main index, which is made again with its new condition. A node of
    version 5 still running enqueues jobs ungated (the column's default): the next housekeeping pass sets their
    flags (QueueStore.recount); until then a held-back queue's new jobs wait, and its limit and rate still hold."""
    _add_column(conn, schema.jobs.c.gated)
    Index("ix_qp_jobs_queued", _VERSION_1_JOBS.c.state).drop(conn)
    for index in schema.jobs.indexes:
        if index.name == "ix_qp_jobs_queued":
            index.create(conn)  # ix_qp_jobs_gated, and the flags, by step 14 in their latest form


def _dependencies(conn: Connection) -> None:
    """6 to 7: dependencies, workflows and groups (store/dependencies.py, store/flows.py). Jobs get the flag a
    child sets on its parents, the count of parents a waiting job waits for and the parent whose failure
    cancelled it (its index); qp_deps, qp_flows and qp_flow_jobs are new. An older node still running finishes
    a parent without releasing its children: no job names a parent until this version enqueues it."""
    for column in (schema.jobs.c.has_children, schema.jobs.c.pending, schema.jobs.c.held_by):
        _add_column(conn, column)
    for index in schema.jobs.indexes:
        if index.name == "ix_qp_jobs_held":
            index.create(conn)
    for table in (schema.deps, schema.flows, schema.flow_jobs):
        table.create(conn, checkfirst=True)


def _progress_and_sql_enqueue(conn: Connection) -> None:
    """7 to 8: a running job's progress, on its job and its run's row (nullable: an older node writes none); and
    qp_enqueue, the database's own door to the queue (sqlfunctions; an older node ignores what it adds)."""
    for table in (schema.jobs, schema.runs):
        _add_column(conn, table.c.progress)
        _add_column(conn, table.c.progress_message)
    create_sql_functions(conn)


# The payload index of versions 9 to 12, on qp_jobs itself (version 13 keeps payloads apart: schema.payloads_ddl).
PAYLOAD_INDEX_BEFORE_13 = DDL(f"""
CREATE OR REPLACE FUNCTION {schema.PAYLOAD_JSON}(payload text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL RESTRICTED
AS $$ BEGIN RETURN payload::jsonb; EXCEPTION WHEN others THEN RETURN NULL; END $$;
CREATE INDEX IF NOT EXISTS ix_qp_jobs_payload ON qp_jobs USING gin ({schema.PAYLOAD_JSON}(payload) jsonb_path_ops)
WHERE payload IS NOT NULL;
DO $$ BEGIN IF current_setting('server_version_num')::int >= 140000 THEN
  EXECUTE 'CREATE STATISTICS IF NOT EXISTS st_qp_jobs_payload ON ({schema.PAYLOAD_JSON}(payload)) FROM qp_jobs';
END IF; END $$;
""")


def _payload_search(conn: Connection) -> None:
    """8 to 9: searches in payloads (store/matching.py) have their index on PostgreSQL; elsewhere nothing changes."""
    if conn.dialect.name == "postgresql":
        conn.execute(PAYLOAD_INDEX_BEFORE_13)


def _farm_history(conn: Connection) -> None:
    """9 to 10: the farm's past (docs/design.md §11): per-queue minutes in qp_history, written from the runs read by
    their end (a new index on qp_runs), and the log of what happened in qp_events."""
    for index in schema.runs.indexes:
        if index.name == "ix_qp_runs_finished":
            index.create(conn, checkfirst=True)
    schema.history.create(conn, checkfirst=True)
    schema.events.create(conn, checkfirst=True)


def _enqueue_through_the_door_only(conn: Connection) -> None:
    """10 to 11: qp_enqueue runs with its owner's rights and its own search_path, and only the roles granted may
    call it (sqlfunctions); a role granted the insert it needed before keeps the door and loses the insert, so a
    role that may enqueue may do nothing more (docs/sql-enqueue.md)."""
    create_sql_functions(conn)
    narrow_enqueuers(conn)


def _job_ids_never_reused(conn: Connection) -> None:
    """11 to 12: SQLite never gives a job id twice (qp_jobs is AUTOINCREMENT: see schema.jobs), so a target that
    keeps the highest fence it saw per job never meets a new job under an old one's id. SQLite cannot alter a
    table's key, so qp_jobs is made again as its documentation says (a new table, the rows copied, the old one
    dropped, the new one renamed, its indexes made); the ids given from now on start above the highest there.
    PostgreSQL's and SQL Server's sequences never reused one: nothing to do there. An older node still running
    sees the same table."""
    if conn.dialect.name != "sqlite":
        return
    made = str(CreateTable(schema.jobs).compile(dialect=conn.dialect)).strip()
    conn.execute(DDL(made.replace("CREATE TABLE qp_jobs ", "CREATE TABLE qp_jobs_new ", 1)))
    there = {column["name"] for column in inspect(conn).get_columns("qp_jobs")}  # a later step's are not yet
    columns = ", ".join(column.name for column in schema.jobs.c if column.name in there)
    conn.execute(DDL(f"INSERT INTO qp_jobs_new ({columns}) SELECT {columns} FROM qp_jobs"))
    conn.execute(DDL("DROP TABLE qp_jobs"))
    conn.execute(DDL("ALTER TABLE qp_jobs_new RENAME TO qp_jobs"))
    for index in schema.jobs.indexes:
        index.create(conn)


def _logs_by_day_and_queue_retention(conn: Connection) -> None:
    """12 to 13: on PostgreSQL the history and the event log are partitioned by day (store/partitions.py), each
    made again so with its rows (renamed, made partitioned, copied, dropped); and a queue may keep its finished
    jobs for a time of its own (qp_queues.keep, NULL: the farm's keep_jobs). An older node still running writes
    and reads both logs as before (an insert finds its day's partition) and deletes their old rows by DELETE; its
    housekeeping deletes finished jobs at the farm's keep_jobs whatever their queue's own time. (A database
    older than 3 has its qp_queues made whole by step 2, and its logs made partitioned by step 9.)"""
    if "keep" not in {column["name"] for column in inspect(conn).get_columns("qp_queues")}:
        _add_column(conn, schema.queues.c.keep)
    if conn.dialect.name == "postgresql":
        partition(conn, schema.history)
        partition(conn, schema.events)


def _roster_read_by_changes(conn: Connection) -> None:
    """12 to 13: each roster change writes its version on the machine row it changed (qp_machines.changed, and its
    index), so a node reads only the rows changed since its version (store/roster.py). The rows there are marked 0,
    changed before any version a node of 13 has read. An older node still running reads every row when the version
    moves, as before, and sees every change; its own changes bump the version without marking a row, and a node of
    13 that finds a version on no row reads every row (roster.KnownMachines.catch_up): it sees them too, at the
    cost of a full read each."""
    _add_column(conn, schema.machines.c.changed)
    for index in schema.machines.indexes:
        if index.name == "ix_qp_machines_changed":
            index.create(conn, checkfirst=True)


def _job_rows_with_room(conn: Connection) -> None:
    """12 to 13, PostgreSQL: job rows at half a page (schema.JOBS_FILL), so a claim's and a finish's new version of a
    row stays on its page (bench/wal.py: a fifth less WAL per job); run rows, written once, fill their pages. A
    storage parameter only: pages written from now on keep the room, those full already fill as jobs are pruned,
    and no row is rewritten. An older node still running beside it works as before (its statements are the same,
    its rows gain the room too), and loses or doubles no run: no table's columns or keys change. Elsewhere
    nothing changes."""
    if conn.dialect.name == "postgresql":
        conn.execute(DDL(f"ALTER TABLE qp_jobs SET (fillfactor = {schema.JOBS_FILL})"))
        conn.execute(DDL("ALTER TABLE qp_runs RESET (fillfactor)"))


def _successes_on_job_rows(conn: Connection) -> None:
    """12 to 13: a run that ends its job in success is kept on its job's row (history.kept_successes), which gains
    the run's output excerpt, and succeeded jobs get an index of their ends (the farm's history reads runs by their
    end); every other run keeps its row in qp_runs. The successes recorded before keep their rows there.

    An older node still running beside it (none can start: the version is newer than its own) claims, renews and
    finishes as before, guarded as before, and writes a row in qp_runs for each success, as it always did: read
    once, that row instead of the job's (the same job and fence). What it reads, it reads as before, so it misses
    the successes an upgraded node ended: a job's runs shown through it (the CLI's or the app's, if they are
    older too), the results of parents an upgraded node ended, passed to a child it runs (None where there was
    a result), and the minutes of history it writes while it holds the turn (those successes uncounted). Upgrade
    every node; the farm is whole again once the last older one has stopped."""
    if "output" not in {column["name"] for column in inspect(conn).get_columns("qp_jobs")}:  # SQLite: step 11 made it
        _add_column(conn, schema.jobs.c.output)
    for index in schema.jobs.indexes:
        if index.name == schema.SUCCEEDED_JOBS:
            index.create(conn, checkfirst=True)


def _layout_for_claim_and_finish(conn: Connection) -> None:
    """12 to 13: job rows with room to be updated in place, and successes kept on them (the two steps above).

    A new qp_jobs has the columns a claim and a finish write last and side by side (schema.jobs), which PostgreSQL
    logs without the rest of the row: bench/wal.py measured 612 B of WAL a job for a claim and a finish against 662
    with the older order. The step does not rebuild an older qp_jobs for that: PostgreSQL cannot move a column, so
    it would copy every job into a new table under a lock that stops every node, older ones too, for as long as
    the copy takes (minutes at millions of jobs), and make again its indexes, trigger and grants, for 50 B a job.
    The output column, added, goes last, where it belongs anyway. (SQLite databases older than 12 are made again by
    step 11, in the new order.)"""
    _job_rows_with_room(conn)
    _successes_on_job_rows(conn)


def _coalesced_push(conn: Connection) -> None:
    """12 to 13, PostgreSQL only: the commits that queue work notify at most once per short interval for the whole
    farm (store/sql/push.py) instead of once each: the NOTIFY trigger on every insert statement is replaced by one
    that runs as the transaction commits, through the throttle row qp_push. An older node still running beside a
    new one keeps working as it did: its releases notify directly, as they did; its listener wakes on the fewer
    notices, but does not claim again after one, so a job whose commit skipped its notice because another commit
    had just sent one may wait for the next turn if only older nodes hold the turns: upgrade the farm's nodes
    together."""
    if conn.dialect.name == "postgresql":
        create_sql_functions(conn)


def _payloads_apart(conn: Connection) -> None:
    """12 to 13, PostgreSQL: payloads are searched in a table of their own, written once per job (schema.payloads_ddl),
    and qp_jobs loses its GIN index, which every claim, finish and renewal of a job with a payload entered again.
    The triggers are made first: their lock on qp_jobs waits for the writers in flight and holds every other
    writer (nodes' claims too) until the step commits, so the copy that follows sees every payload there is and
    none is written past it; the copy takes a few seconds a million jobs with a payload.

    An older node still running beside it loses no payload: the triggers copy what it enqueues (or a schedule or
    a group of its changes), and drop the copy of a job it deletes; its claims return payloads from the job row as
    before. Its own searches by payload field find the same jobs, each by reading every job with a payload (the
    index they used is gone): slow at millions of jobs, until it is upgraded. Elsewhere nothing changes: SQLite
    and SQL Server search the job row's payload as before."""
    if conn.dialect.name != "postgresql" or inspect(conn).has_table(schema.PAYLOADS):
        return
    schema.keep_payloads_apart(conn)
    conn.execute(
        DDL(
            f"INSERT INTO {schema.PAYLOADS} (job_id, doc) SELECT id, doc FROM "
            f"(SELECT id, {schema.PAYLOAD_JSON}(payload) AS doc FROM qp_jobs WHERE payload IS NOT NULL) AS j "
            "WHERE doc IS NOT NULL ON CONFLICT (job_id) DO NOTHING"
        )
    )
    conn.execute(DDL("DROP INDEX IF EXISTS ix_qp_jobs_payload"))
    conn.execute(DDL("DROP STATISTICS IF EXISTS st_qp_jobs_payload"))


def _storage_that_costs_what_work_needs(conn: Connection) -> None:
    """12 to 13: the roster read by changes, the job row's layout, payloads apart, the logs by day and retention per
    queue, and coalesced push (each step says what it does, and what an older node still running beside it can
    do)."""
    _roster_read_by_changes(conn)
    _layout_for_claim_and_finish(conn)
    _payloads_apart(conn)
    _logs_by_day_and_queue_retention(conn)
    _coalesced_push(conn)


def _finished_jobs_by_range(conn: Connection) -> None:
    """13 to 14, PostgreSQL: qp_jobs, qp_runs and qp_payloads are partitioned by ranges of job id, each about a day
    of enqueues, and finished jobs leave with their range's partition (store/job_partitions.py, docs/design.md
    §11). Each table becomes, in place, the first partition of its new partitioned table (every id given so far: a
    CHECK validated first spares ATTACH a second scan; its indexes are kept as they are), keys and running order
    keys are copied into their side tables, and the ranges ahead are made; ids and the sequence stay as they are.
    The step holds qp_jobs and qp_runs alone for a scan of each and a copy of the keys (seconds a million jobs):
    every node waits for it.

    An older node still running beside it goes on working: its statements name the same tables and columns, its
    inserts land in the range ahead, its keys and order keys are kept unique by the side tables' triggers (a
    duplicate fails as before, naming the same constraint), and its housekeeping deletes finished jobs by DELETE
    at their keep (the rows it deletes leave ranges that would have gone whole anyway). Elsewhere nothing changes:
    SQLite and SQL Server keep one table each."""
    if conn.dialect.name == "postgresql":
        partition_jobs(conn)
        create_sql_functions(conn)


def _fair_shares_and_limits_per_key(conn: Connection) -> None:
    """Fair shares, limits and rates per key (docs/design.md §9). Jobs get a fairness key, weight, cost and
    virtual start tag; queues their fair, limit per key and rate per key settings (every existing queue none), and
    qp_key_buckets holds those rates' buckets; the claim's index of held-back queues orders by the tag before the
    age. The new partial indexes start empty; the jobs' gated flags are set by today's rules.

    An older node still running beside it goes on working as it did: it knows no fair queue nor limit per key, and
    takes none of the jobs a newer node gates for them. But the jobs it enqueues itself into such a queue, it sees
    ungated, and claims without fairness, limit or rate until a newer node's housekeeping gates them (recount):
    upgrade every node before making a queue fair or giving it a limit or rate per key."""
    for table, names in (
        (schema.jobs, ("fair_key", "fair_weight", "cost", "vtag")),
        (schema.queues, ("fair", "key_limit", "fair_from", "key_rate_count", "key_rate_per", "key_burst")),
    ):
        there = {column["name"] for column in inspect(conn).get_columns(table.name)}  # SQLite: step 11 made them
        for name in names:
            if name not in there:
                _add_column(conn, table.c[name])
    schema.key_buckets.create(conn, checkfirst=True)
    indexes = {str(index.name): index for index in schema.jobs.indexes}
    indexes["ix_qp_jobs_gated"].drop(conn, checkfirst=True)  # made again with the tag (step 5 left it to us)
    for name in ("ix_qp_jobs_gated", "ix_qp_jobs_vtag", "ix_qp_jobs_fair", "ix_qp_jobs_key_running"):
        indexes[name].create(conn, checkfirst=True)
    for statement in regate_statements():  # as the queues say now (step 5's flags, set here by today's rules)
        conn.execute(statement)
    create_sql_functions(conn)  # qp_enqueue tags a job of a fair queue too


def _snoozes_counted(conn: Connection) -> None:
    """A run may end snoozed (docs/design.md §9): jobs count their snoozes (nullable: NULL until the first)
    and the farm's history counts snoozed runs (a server default of 0: an older node's minutes fill it). An older
    node still running beside it never snoozes a job (its executors have no snooze) and writes its minutes without
    the count; its claim and finish name neither column. (An older database whose qp_jobs step 11 made again, or whose
    qp_history step 9 made, has them already.)"""
    for column in (schema.jobs.c.snoozes, schema.history.c.snoozed):
        if column.name not in {c["name"] for c in inspect(conn).get_columns(column.table.name)}:
            _add_column(conn, column)


# The qp_queues columns of breakers and adaptive rates (schema 15).
FLOW_COLUMNS = (
    "breaker_failures",
    "breaker_window",
    "breaker_cooldown",
    "breaker_state",
    "breaker_at",
    "breaker_count",
    "breaker_from",
    "adapt_floor",
    "adapt_at",
    "adapt_throttled",
    "rate_set_per",
    "flow_version",
)


def _breakers_and_adaptive_rates(conn: Connection) -> None:
    """A queue may have a breaker and an adaptive rate (rules/breaker.py): nullable columns of qp_queues,
    NULL on every row (no queue has either). An older node still running beside it claims and finishes as before;
    it knows no breaker: it neither counts failures nor honours an open breaker of a queue with no limit or rate
    (its claim and housekeeping leave such a queue's jobs ungated), and a node of 15 honours it alone. Set a
    breaker once every node runs 15."""
    have = {column["name"] for column in inspect(conn).get_columns("qp_queues")}
    for name in FLOW_COLUMNS:
        if name not in have:
            _add_column(conn, schema.queues.c[name])


def _flow_control(conn: Connection) -> None:
    """14 to 15: flow control (docs/design.md §9): breakers and adaptive rates, fair shares, limits and rates per key,
    and snoozes (each step says what it does, and what an older node still running beside it can do); the jobs'
    gated flags are set by today's rules once the queues' new columns are there."""
    _breakers_and_adaptive_rates(conn)
    _fair_shares_and_limits_per_key(conn)
    _snoozes_counted(conn)


def _keys_on_their_own_terms(conn: Connection) -> None:
    """A job may hold its key on its own terms (rules/keys.py): two nullable columns of qp_jobs, NULL on every job
    there is (each keeps its key while its row is kept, as before). An older node still running beside it enqueues,
    claims and finishes as before; its enqueue refuses any key that is taken, even by a job whose terms gave it up
    (a node of 16 takes such a key back), and it does not settle conflicts or debounce. qp_enqueue takes a key and
    its terms (a call of the six parameters it had still works; the roles granted it keep it)."""
    have = {column["name"] for column in inspect(conn).get_columns("qp_jobs")}
    for column in (schema.jobs.c.key_scope, schema.jobs.c.key_hold):
        if column.name not in have:
            _add_column(conn, column)
    create_sql_functions(conn)


# The qp_schedules columns of overlap policies, jitter, pause-until and pause-on-failure (schema 16).
SCHEDULE_POLICY_COLUMNS = (
    "overlap",
    "jitter",
    "pause_on_failure",
    "failures",
    "counted",
    "paused_until",
    "paused_why",
)


def _schedule_policies(conn: Connection) -> None:
    """A schedule may have an overlap policy, jitter, a time to resume at and a pause on failure
    (docs/design.md §6): columns of qp_schedules, `allow` and 0 on every row there (their server defaults: as before),
    the rest NULL. An older node still running beside it makes every schedule's occurrences as before: it reads
    none of them, so it gives a schedule with a policy's occurrences neither the farm's order key nor their jitter,
    applies no overlap policy, never resumes a schedule at its time nor counts failures; a node of 16 applies them
    at its turns. Set them once every node runs 16."""
    have = {column["name"] for column in inspect(conn).get_columns("qp_schedules")}
    for name in SCHEDULE_POLICY_COLUMNS:
        if name not in have:
            _add_column(conn, schema.schedules.c[name])


def _exactly_the_runs_meant(conn: Connection) -> None:
    """15 to 16 (docs/design.md §6): keys held on their own terms, and schedules' overlap policies, jitter, pause
    until and pause on failure (each step says what it does, and what an older node still running beside it can
    do)."""
    _keys_on_their_own_terms(conn)
    _schedule_policies(conn)


def _trace_context_kept(conn: Connection) -> None:
    """16 to 17 (docs/design.md §12): a job keeps the W3C traceparent it was enqueued under, a nullable column of
    qp_jobs (on PostgreSQL added to the partitioned table, so every range has it), NULL on every job there is; and
    qp_enqueue takes a traceparent last (the roles granted the one of schema 16 keep the door). An older node still
    running beside it enqueues, claims, runs and finishes as before, and traces nothing: its runs of traced jobs are
    missing from their traces."""
    if "traceparent" not in {column["name"] for column in inspect(conn).get_columns("qp_jobs")}:
        _add_column(conn, schema.jobs.c.traceparent)
    create_sql_functions(conn)


# The step that upgrades a database from each version to the next.
STEPS = {
    1: _index_queued_jobs_only,
    2: _named_queues,
    3: _heartbeat_reads,
    4: _running_counts,
    5: _gated_jobs,
    6: _dependencies,
    7: _progress_and_sql_enqueue,
    8: _payload_search,
    9: _farm_history,
    10: _enqueue_through_the_door_only,
    11: _job_ids_never_reused,
    12: _storage_that_costs_what_work_needs,
    13: _finished_jobs_by_range,
    14: _flow_control,
    15: _exactly_the_runs_meant,
    16: _trace_context_kept,
}


def upgrade(engine: Engine) -> int | None:
    """Bring an older farm database up to schema.SCHEMA_VERSION; the version it had, or None if it was current."""
    version_row = schema.meta.c.key == "schema_version"
    with engine.begin() as conn:  # SQLite: BEGIN IMMEDIATE, its write lock (see database)
        found = conn.execute(select(schema.meta.c.value).where(version_row).with_for_update()).scalar()
        if found is None or int(found) >= schema.SCHEMA_VERSION:
            return None
        for version in range(int(found), schema.SCHEMA_VERSION):
            STEPS[version](conn)
        conn.execute(update(schema.meta).where(version_row).values(value=str(schema.SCHEMA_VERSION)))
        return int(found)
