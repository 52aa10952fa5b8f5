"""The tables, in SQLAlchemy Core, and the schema version they make up.

All times are epoch seconds written by the database (see dbtime). Dialect
differences are gathered here: SQL Server allows one NULL in a unique index,
so unique keys there are filtered indexes.
"""

from typing import Any

from sqlalchemy import (
    DDL,
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    bindparam,
    event,
    false,
    literal_column,
    true,
)
from sqlalchemy.sql import ColumnElement, operators
from sqlalchemy.sql.elements import ColumnClause
from sqlalchemy.sql.operators import OperatorType

from ..rules.fairness import MAX_FAIR_KEY
from ..rules.limits import MAX_ATTEMPTS, PROGRESS_NOTE
from ..rules.queues import DEFAULT, MAX_NAME, MAX_ORDER_KEY, OnFailure
from ..rules.schedules import DEFAULT_MISFIRE, DEFAULT_OVERLAP
from ..rules.states import CHECKING_IN, HISTORY_COUNTS, JobState, Kind, MachineState, Outcome
from .partitions import partition
from .sql import push
from .sql.ddl import farm_schema, quoted, run, side_triggers

SCHEMA_VERSION = 17

metadata = MetaData()

# The partial indexes, each with the condition of the rows it holds. A condition is handed to a dialect
# (`<dialect>_where`) only when that dialect builds or checks the schema (`partial_for`): written out for all
# three here, it made SQLAlchemy load the SQLite and SQL Server dialects into every PostgreSQL node (1.5 MB
# of an idle node's memory).
_PARTIAL: list[tuple[Index, ColumnElement[bool]]] = []


def partial(name: str, *columns: ColumnElement[Any], where: ColumnElement[bool], unique: bool = False) -> Index:
    index = Index(name, *columns, unique=unique)
    _PARTIAL.append((index, where))
    return index


def partial_for(dialect: str) -> None:
    """Give every partial index its condition in `dialect`'s terms (idempotent): before that dialect's DDL. On
    SQLite, qp_jobs is AUTOINCREMENT too (given here for the same reason: said in the Table, it loads the SQLite
    dialect everywhere): SQLite would give a deleted newest job's id to the next job (rowid: max + 1), whose
    fences start at 1 again, so a target that keeps the highest fence it saw per job would refuse its writes.
    AUTOINCREMENT never gives an id twice (schema 12; PostgreSQL's and SQL Server's sequences never did)."""
    for index, where in _PARTIAL:
        index.dialect_options[dialect]["where"] = where
    if dialect == "sqlite":
        jobs.dialect_options["sqlite"]["autoincrement"] = True
    if dialect == "postgresql":
        SUCCEEDED_INDEX.dialect_options["postgresql"]["using"] = "brin"


# Every job state, as SQL text. Compiled into a statement once and cached with it, where a literal_execute
# parameter would be rendered into the SQL again on every execution (and executemany takes none at all).
def _quoted(word: str) -> str:
    """One of our own state words as an SQL string literal: letters only, so nothing in it needs escaping."""
    if not word.isalpha():
        raise ValueError(f"not a state word: {word!r}")
    return f"'{word}'"


STATE_SQL: dict[str, ColumnClause[Any]] = {state: literal_column(_quoted(state)) for state in JobState}


class StateColumn(TypeDecorator[str]):
    """A job's state, VARCHAR(16). A statement that compares it with a given state names that state in its
    text instead of binding it: a plan made for any value cannot use the indexes kept for one state only
    (psycopg prepares a statement it runs often, and PostgreSQL may then plan it once for all values; SQL
    Server never matches a filtered index to a bound value)."""

    impl = String(16)
    cache_ok = True

    class comparator_factory(TypeDecorator.Comparator[str]):
        def operate(self, op: OperatorType, *other: Any, **kwargs: Any) -> ColumnElement[Any]:
            if op is operators.eq and isinstance(other[0], str):
                text = STATE_SQL.get(other[0])  # no job is in any other state: bound, it still matches none
                other = (
                    text
                    if text is not None
                    else bindparam("state", other[0], String(16), unique=True, literal_execute=True),
                )
            return super().operate(op, *other, **kwargs)


# SQLite only auto-increments an INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")
Time = Float(precision=53)

meta = Table(
    "qp_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(200), nullable=False),
)

# Machine rows spread thin (about four to a page): PostgreSQL reads a table of a few pages whole rather than look a
# row up by index, so the heartbeats of a farm of dozens would each read every machine row after all.
MACHINES_FILL = 10

machines = Table(
    "qp_machines",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("host", String(255), nullable=False),
    Column("instance", String(32), nullable=False, unique=True),
    Column("pid", Integer, nullable=False),
    Column("version", String(32), nullable=False),
    # active | paused | draining | stopped | dead ("dead" is judged first, then stored by the first judge: a burial).
    Column("state", String(16), nullable=False, default=MachineState.ACTIVE),
    # An operator's wish (pause | resume | drain), applied by the node itself.
    Column("wish", String(16), nullable=True),
    Column("capacity", Integer, nullable=False),
    Column("running", Integer, nullable=False, default=0),
    Column("done_count", Integer, nullable=False, default=0),
    Column("failed_count", Integer, nullable=False, default=0),
    Column("joined_at", Time, nullable=False),
    Column("last_seen", Time, nullable=False),
    Column("clock_offset", Time, nullable=True),
    Column("rtt", Time, nullable=True),
    Column("error_bound", Time, nullable=True),
    # The node's allow-lists as JSON, so an enqueuer can refuse work no live machine would run.
    Column("allow", Text, nullable=True),
    # The queues it serves, as typed after --queues ("reports:2,default"; "" for every queue). Written once, when
    # the machine registers: a node's queues are fixed for its life.
    Column("queues", String(2000), nullable=False, default="", server_default=""),
    # The roster version that last changed this row (a join, a new state, a stop, a burial): written with the bump,
    # in its transaction, so a node behind by a few versions reads only the rows changed since (store/roster.py).
    Column("changed", BigInteger, nullable=False, default=0, server_default="0"),
    Index("ix_qp_machines_changed", "changed"),
)
# The heartbeat read (store/roster.py) asks two questions of these rows that an index answers without reading the
# others: the oldest last_seen of the machines checking in (the first entry of the first index), and whether an
# operator left a wish on ours (the second holds only the machines with one, usually none).
# The states are written as SQL text, not bound, so that a planner can match the statements to the index.
CHECKING_IN_SQL = machines.c.state.in_([literal_column(_quoted(state)) for state in CHECKING_IN])
partial("ix_qp_machines_seen", machines.c.last_seen, where=CHECKING_IN_SQL)
WISHED = machines.c.wish.isnot(None)
partial("ix_qp_machines_wished", machines.c.id, where=WISHED)

# The roster version: one row, bumped in the same transaction as every change of a row the roster is
# made of (a machine joins, stops, is buried, or writes a new state) and written on the row it changed
# (qp_machines.changed), so a heartbeat learns whether any changed by reading one number, and which by reading
# only those rows (see store/roster.py).
roster_version = Table(
    "qp_roster",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("version", BigInteger, nullable=False),
)
event.listen(roster_version, "after_create", DDL("INSERT INTO qp_roster (id, version) VALUES (1, 0)"))

turns = Table(
    "qp_turns",
    metadata,
    # The slot number is the key: a second turn for the same slot is refused.
    Column("slot", BigInteger, primary_key=True, autoincrement=False),
    Column("machine_id", Id, nullable=False),
    Column("taken_at", Time, nullable=False),
    Column("claimed", Integer, nullable=False, default=0),
    Column("backlog", Boolean, nullable=False, default=False),
    Index("ix_qp_turns_taken_at", "taken_at"),
)

jobs = Table(
    "qp_jobs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("executor", String(16), nullable=False),
    Column("target", String(2000), nullable=False),
    Column("method", String(10), nullable=False, default="GET"),
    Column("payload", Text, nullable=True),
    Column("priority", Integer, nullable=False, default=0),
    Column("run_at", Time, nullable=False),
    Column("created_at", Time, nullable=False),
    Column("max_attempts", Integer, nullable=False, default=MAX_ATTEMPTS),
    Column("timeout", Float, nullable=True),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("key", String(400), nullable=True),
    # job | singleton (a singleton is requeued whenever its work ends, and never runs out of attempts)
    Column("kind", String(16), nullable=False, default=Kind.JOB),
    # Who enqueued it ("host pid N"): a refused grab names the winner.
    Column("origin", String(200), nullable=True),
    Column("queue", String(MAX_NAME), nullable=False, default=DEFAULT, server_default=DEFAULT),
    # Jobs of one order key in one queue run one at a time, oldest first (see sql.claim.claim_statement).
    Column("order_key", String(MAX_ORDER_KEY), nullable=True),
    # Its queue holds its jobs back (paused, or a farm-wide limit or rate; see sql.gates.gated_now): kept out of
    # the index every other claim walks, so a held-back queue's backlog is never in that walk's way.
    Column("gated", Boolean, nullable=False, default=False, server_default=false()),
    # Dependencies (store/dependencies.py, docs/design.md §10): set once a job names this one in its `after`, so
    # only a finish of a parent takes the path that releases children; a waiting job's count of parents it still
    # waits for; and, for a job cancelled because a parent failed, that parent (a retry of it restores the job).
    Column("has_children", Boolean, nullable=False, default=False, server_default=false()),
    Column("pending", Integer, nullable=False, default=0, server_default="0"),
    Column("held_by", Id, nullable=True),
    # How many times its runs ended snoozed (a 429 with Retry-After, context.snooze; docs/design.md §9), bounded by
    # rules.limits.MAX_SNOOZES: NULL (no byte of the row) until its first snooze (schema 15).
    Column("snoozes", Integer, nullable=True),
    # The columns a claim and a finish write, last and side by side (schema 13, measured by bench/wal.py): PostgreSQL
    # logs a new row version on its page without the bytes it shares with the old one at its start and its end, so
    # the rest of the row (target, payload, key...) stays out of the WAL of both.
    Column("owner", Id, nullable=True),
    # Bumped by every claim; every write by the owner must quote it.
    Column("fence", BigInteger, nullable=False, default=0),
    Column("attempts", Integer, nullable=False, default=0),
    Column("started_at", Time, nullable=True),
    # queued | running | succeeded | failed | cancelled
    Column("state", StateColumn(), nullable=False, default=JobState.QUEUED),
    Column("lease_until", Time, nullable=True),
    Column("finished_at", Time, nullable=True),
    # A succeeded job's run is its row (store/history.py kept_successes): an excerpt of what that run printed or
    # returned, written by the finish that ended it; NULL on every other job.
    Column("output", Text, nullable=True),
    Column("last_error", Text, nullable=True),
    # How far its running job says it is (context.progress): written with the lease renewal, reset by a claim.
    Column("progress", Float, nullable=True),
    Column("progress_message", String(PROGRESS_NOTE), nullable=True),
    # Fair shares and limits per key (schema 15, docs/design.md §9): whose share and per-key limit the job counts
    # in, that key's weight and the job's cost (NULL: 1), and, in a fair queue, its virtual start tag (sql/fair.py),
    # which orders the queue's claims. NULL on every job that uses none of it: it costs such a row nothing.
    Column("fair_key", String(MAX_FAIR_KEY), nullable=True),
    Column("fair_weight", Float, nullable=True),
    Column("cost", Integer, nullable=True),
    Column("vtag", Float, nullable=True),
    # How long it holds its key (schema 16, rules/keys.py): NULL (kept while the row is), or waiting, unfinished,
    # until (key_hold: the time) or after (key_hold: seconds after success). NULL on a job without such terms.
    Column("key_scope", String(12), nullable=True),
    Column("key_hold", Float, nullable=True),
    # The W3C traceparent it was enqueued under (docs/design.md §12): its runs' spans join that trace. NULL on a job
    # enqueued outside a trace, which costs its row nothing.
    Column("traceparent", String(55), nullable=True),
)
# A claim and a finish change a job's state, so no update is HOT: each new row version enters every index
# whose condition it meets. So all but the primary key are partial, each the size of what it serves: the
# queued jobs in the claim's order; the leases of running jobs, for a turn's search for expired ones; jobs
# that failed or were cancelled, for the app's look-ups by state (a succeeded job enters only that of its
# end, below); keys, for the jobs that have one; and the singletons (the app lists them every poll).
QUEUED = jobs.c.state == JobState.QUEUED
partial("ix_qp_jobs_queued", jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id, where=QUEUED & (jobs.c.gated == false()))
# The queued jobs of held-back queues, by queue: each such queue's claim branch, and the turn's look for its due
# jobs, read its own jobs only (docs/design.md §9).
# In a fair queue the virtual start tag comes before the age (NULL in every other queue: the same order as before).
partial(
    "ix_qp_jobs_gated",
    jobs.c.queue,
    jobs.c.priority.desc(),
    jobs.c.vtag,
    jobs.c.run_at,
    jobs.c.id,
    where=QUEUED & (jobs.c.gated == true()),
)
# Fair queues (sql/fair.py): a new job's tag reads its queue's least waiting tag and its key's greatest; a claim
# with limits per key reads each key's running units. Only jobs that use them enter these.
TAGGED = QUEUED & jobs.c.vtag.isnot(None)
partial("ix_qp_jobs_vtag", jobs.c.queue, jobs.c.vtag, where=TAGGED)
partial("ix_qp_jobs_fair", jobs.c.queue, jobs.c.fair_key, jobs.c.vtag, where=TAGGED)
partial(
    "ix_qp_jobs_key_running",
    jobs.c.queue,
    jobs.c.fair_key,
    where=(jobs.c.state == JobState.RUNNING) & jobs.c.fair_key.isnot(None),
)
ENDED_BADLY = jobs.c.state.in_((JobState.FAILED, JobState.CANCELLED))
partial("ix_qp_jobs_ended_badly", jobs.c.state, jobs.c.id, where=ENDED_BADLY)
partial("ix_qp_jobs_lease", jobs.c.lease_until, where=jobs.c.state == JobState.RUNNING)
partial("ix_qp_jobs_singletons", jobs.c.key, where=jobs.c.kind == Kind.SINGLETON)
partial("ux_qp_jobs_key", jobs.c.key, unique=True, where=jobs.c.key.isnot(None))
# Order keys: the claim asks whether an older job of the key is unfinished, or any of it running; only jobs
# with a key enter these. The unique one makes two running jobs of one key impossible whatever the code does.
ORDERED = jobs.c.order_key.isnot(None)
partial("ix_qp_jobs_order", jobs.c.queue, jobs.c.order_key, jobs.c.id, where=ORDERED)
ORDERED_RUNNING = ORDERED & (jobs.c.state == JobState.RUNNING)
partial("ux_qp_jobs_order_running", jobs.c.queue, jobs.c.order_key, unique=True, where=ORDERED_RUNNING)
# Succeeded jobs by their end: a success is its job's row, with no row in qp_runs, and the farm's history reads each
# minute's ended runs by their end (store/stats.py). A claim's new row versions never enter it. On PostgreSQL a BRIN
# index (partial_for), the least and greatest end per 128 pages of jobs: a batch's finish, which writes one end for
# all its jobs (sql.runs.finish_statement), widens a range's summary at most once, and not at all in the pages added
# since the last vacuum, which it leaves unsummarised (bench/wal.py: 66 B of WAL a job less than a btree's entry).
# The history writer reads it by a bitmap scan (which a node's connections plan only where asked: stats.write_minute);
# an unsummarised range is read whole, so the pages added since autovacuum's last pass are.
SUCCEEDED_JOBS = "ix_qp_jobs_succeeded"
SUCCEEDED_INDEX = partial(SUCCEEDED_JOBS, jobs.c.finished_at, where=jobs.c.state == JobState.SUCCEEDED)
# The jobs a failed parent cancelled, by that parent: what its retry restores (only they enter it).
partial("ix_qp_jobs_held", jobs.c.held_by, where=jobs.c.held_by.isnot(None))

# Job rows at half a page each (PostgreSQL, measured by bench/wal.py): a claim's and a finish's new version of the row
# finds room on its page, so the update logs only what changed and no lock of a second page (a full page made each
# move to another, the whole new row in the WAL with it). A bulk enqueue writes twice the pages.
JOBS_FILL = 50

# PostgreSQL only: a commit that queues work wakes the listening nodes, at most one notice per short interval for the
# whole farm (store/sql/push.py, made with qp_enqueue by sqlfunctions; node/push.py listens).
JOBS_CHANNEL = push.JOBS_CHANNEL

# PostgreSQL only: searches in payloads (store/matching.py) by containment, answered by a GIN index of jsonb_path_ops
# over a table of their own, qp_payloads (schema 13): each job's payload as jsonb, written once as the job is
# enqueued, so no claim, finish or renewal of a job, none of them HOT, enters the payload's keys again (on qp_jobs
# the index did, at every update: bench/wal.py). The job row keeps its payload as text, unindexed, for the claim to
# return: a new version of the row on its page logs none of it (see JOBS_FILL). Triggers keep the copy, whoever
# writes qp_jobs (the Python enqueue, qp_enqueue, a schedule, a workflow, a node older than 13): a job inserted or
# given a new payload gets its row, a job deleted loses it; only jobs with a payload fire them. The payload column
# is text, and a row written by a plain SQL insert may hold text that is not JSON: qp_payload_json makes that NULL
# (no row) where a cast would fail the insert. Its exception block is a subtransaction, which a parallel worker
# cannot start: PARALLEL RESTRICTED. The trigger function runs with its owner's rights (a role that may write
# qp_jobs keeps its side table whatever its grants) and a pinned search_path, naming the tables in their schema.
PAYLOAD_JSON = "qp_payload_json"
PAYLOADS = "qp_payloads"
PAYLOADS_INDEX = "ix_qp_payloads"


def payloads_ddl(farm_schema: str) -> str:
    """The side table of payloads, its index and its triggers, in `farm_schema` (the database's own name of it)."""
    s = quoted(farm_schema)
    return f"""
CREATE OR REPLACE FUNCTION {PAYLOAD_JSON}(payload text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL RESTRICTED
AS $$ BEGIN RETURN payload::jsonb; EXCEPTION WHEN others THEN RETURN NULL; END $$;
CREATE TABLE IF NOT EXISTS {PAYLOADS} (job_id bigint PRIMARY KEY, doc jsonb NOT NULL);
CREATE INDEX IF NOT EXISTS {PAYLOADS_INDEX} ON {PAYLOADS} USING gin (doc jsonb_path_ops);
CREATE OR REPLACE FUNCTION qp_payloads_kept() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF TG_OP <> 'INSERT' THEN DELETE FROM {s}.{PAYLOADS} WHERE job_id = OLD.id; END IF;
  IF TG_OP <> 'DELETE' THEN
    INSERT INTO {s}.{PAYLOADS} (job_id, doc)
    SELECT NEW.id, doc FROM (SELECT {s}.{PAYLOAD_JSON}(NEW.payload) AS doc) AS d WHERE doc IS NOT NULL;
  END IF;
  RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION qp_payloads_kept() FROM PUBLIC;
""" + side_triggers(PAYLOADS, "payload", "qp_payloads_kept")


def keep_payloads_apart(connection: Any) -> None:
    """PostgreSQL: make the side table of payloads (payloads_ddl) in the schema qp_jobs was made in."""
    if connection.dialect.name == "postgresql":
        run(connection, payloads_ddl(farm_schema(connection)))


event.listen(jobs, "after_create", lambda _table, connection, **_: keep_payloads_apart(connection))

runs = Table(
    "qp_runs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("job_id", Id, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("machine_id", Id, nullable=False),
    Column("fence", BigInteger, nullable=False),
    Column("started_at", Time, nullable=False),
    Column("finished_at", Time, nullable=True),
    # running | succeeded | failed | lost | cancelled | timeout | snoozed
    Column("outcome", String(16), nullable=False, default=Outcome.RUNNING),
    Column("error", Text, nullable=True),
    # An excerpt of what the work printed or returned.
    Column("output", Text, nullable=True),
    # The run's last progress written while it ran (its job's, copied as it ends).
    Column("progress", Float, nullable=True),
    Column("progress_message", String(PROGRESS_NOTE), nullable=True),
    Index("ix_qp_runs_job", "job_id"),
    Index("ix_qp_runs_started", "started_at"),
    # The history writer reads each minute's ended runs by their end (store/stats.py): one entry per run, written once.
    Index("ix_qp_runs_finished", "finished_at"),
)


def _fill(table: Table, percent: int) -> None:
    """PostgreSQL only: leave room in each page of `table`, set as it is created (still empty). A DDL event, not
    the table's postgresql_with: that keyword makes SQLAlchemy load its PostgreSQL dialect wherever this module is
    imported, a tenth of what a command on SQLite (`enqueue`) spends loading."""
    fill = DDL(f"ALTER TABLE {table.name} SET (fillfactor = {percent})").execute_if(dialect="postgresql")
    event.listen(table, "after_create", fill)


_fill(machines, MACHINES_FILL)
_fill(jobs, JOBS_FILL)

schedules = Table(
    "qp_schedules",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False, unique=True),
    # Exactly one of cron (with tz) and every is set.
    Column("cron", String(200), nullable=True),
    Column("tz", String(64), nullable=True),
    Column("every", Float, nullable=True),
    Column("executor", String(16), nullable=False),
    Column("target", String(2000), nullable=False),
    Column("method", String(10), nullable=False, default="GET"),
    Column("payload", Text, nullable=True),
    Column("priority", Integer, nullable=False, default=0),
    Column("max_attempts", Integer, nullable=False, default=MAX_ATTEMPTS),
    Column("timeout", Float, nullable=True),
    # skip | once | all: what to do with occurrences the farm noticed late (see schedules)
    Column("misfire", String(8), nullable=False, default=DEFAULT_MISFIRE),
    Column("grace", Float, nullable=False),
    Column("paused", Boolean, nullable=False, default=False),
    # The first occurrence not yet materialised as a job; advanced by compare-and-set.
    Column("next_run", Time, nullable=False),
    Column("created_at", Time, nullable=False),
    Column("queue", String(MAX_NAME), nullable=False, default=DEFAULT, server_default=DEFAULT),
    Column("order_key", String(MAX_ORDER_KEY), nullable=True),
    # Overlap policy, jitter and pause-on-failure (schema 16, docs/design.md §6, store/schedule_policy.py): allow and
    # 0 as before; the rest NULL while unused. `failures`: its runs in a row that failed for good, counted up to its
    # job `counted`; `paused_until`: when the farm resumes it; `paused_why`: why it paused itself, or until when.
    Column("overlap", String(16), nullable=False, default=DEFAULT_OVERLAP, server_default=DEFAULT_OVERLAP),
    Column("jitter", Float, nullable=False, default=0.0, server_default="0"),
    Column("pause_on_failure", Integer, nullable=True),
    Column("failures", Integer, nullable=True),
    Column("counted", Id, nullable=True),
    Column("paused_until", Time, nullable=True),
    Column("paused_why", String(400), nullable=True),
    Index("ix_qp_schedules_next", "paused", "next_run"),
)

locks = Table(
    "qp_locks",
    metadata,
    # A named lease: one holder at a time, a fence that every new holder bumps,
    # an expiry in database time that the holder renews.
    Column("name", String(200), primary_key=True),
    Column("holder", String(200), nullable=True),
    Column("fence", BigInteger, nullable=False, default=0),
    Column("lease_until", Time, nullable=True),
    Column("acquired_at", Time, nullable=True),
)

queues = Table(
    "qp_queues",
    metadata,
    # A queue an operator has set something on (a queue with no row is unpaused, unlimited, policy skip).
    Column("name", String(MAX_NAME), primary_key=True),
    Column("paused", Boolean, nullable=False, default=False),
    Column("max_running", Integer, nullable=True),  # farm-wide limit of running jobs
    # While there is a limit: how many of the queue's jobs run, moved by every statement that moves one of them
    # into or out of running, so a claim checks the limit on this row alone (docs/design.md §9).
    Column("running", Integer, nullable=False, default=0, server_default="0"),
    Column("rate_count", Integer, nullable=True),  # rate: rate_count starts per rate_per seconds
    Column("rate_per", Float, nullable=True),
    # The rate's token bucket, spent by claims in the claim's transaction, refilled in database time.
    Column("burst", Float, nullable=True),
    Column("tokens", Float, nullable=True),
    Column("refilled_at", Time, nullable=True),
    Column("on_failure", String(8), nullable=False, default=OnFailure.SKIP),
    # Seconds its finished jobs are kept (NULL: the farm's default, the nodes' keep_jobs): JobStore.prune.
    Column("keep", Float, nullable=True),
    # Fair share (its claims take its keys' jobs by virtual time) and the most units one fairness key may run at
    # once (schema 15, docs/design.md §9): either makes the queue guarded, claimed under its row's lock.
    Column("fair", Boolean, nullable=False, default=False, server_default=false()),
    Column("key_limit", Integer, nullable=True),
    # Where a job enqueued without a fairness key takes one (rules.fairness.check_fair_from; NULL: nowhere).
    Column("fair_from", String(80), nullable=True),
    # A rate per fairness key: key_rate_count starts per key_rate_per seconds, each key's bucket of key_burst
    # tokens in qp_key_buckets (schema 15).
    Column("key_rate_count", Integer, nullable=True),
    Column("key_rate_per", Float, nullable=True),
    Column("key_burst", Float, nullable=True),
    # Its breaker and adaptive rate (rules/breaker.py, store/breakers.py), NULL when it has none. The breaker:
    # breaker_failures within breaker_window seconds open it; breaker_cooldown (NULL: the default) before a canary;
    # its state (NULL: closed); breaker_at, open or half-open: when the next canary may start (the claim reads it),
    # ramping: when the next step is due; breaker_count failures counted in the window that began at breaker_from.
    Column("breaker_failures", Integer, nullable=True),
    Column("breaker_window", Float, nullable=True),
    Column("breaker_cooldown", Float, nullable=True),
    Column("breaker_state", String(10), nullable=True),
    Column("breaker_at", Time, nullable=True),
    Column("breaker_count", Integer, nullable=True),
    Column("breaker_from", Time, nullable=True),
    # The adaptive rate: its floor (starts per second); the window that began at adapt_at has seen adapt_throttled
    # throttled endings. While the current rate (rate_per, what the bucket uses) is lowered by it or by a
    # breaker's ramp, rate_set_per holds the configured one's (the ceiling).
    Column("adapt_floor", Float, nullable=True),
    Column("adapt_at", Time, nullable=True),
    Column("adapt_throttled", Integer, nullable=True),
    Column("rate_set_per", Float, nullable=True),
    # Moved by every write of the columns above: a node's write of them is guarded by the value it read.
    Column("flow_version", Integer, nullable=True),
    # Database time of the last change by an operator: nodes see it in their heartbeat read and re-read.
    Column("changed_at", Time, nullable=False),
)

# The token buckets of a queue's rate per fairness key (schema 15, docs/design.md §9): a key's row is written by the
# claims that start its jobs, under the queue row's lock; a key without a row has a full bucket, so a row that has
# refilled for longer than any rate's period says nothing and housekeeping deletes it (QueueStore.recount).
key_buckets = Table(
    "qp_key_buckets",
    metadata,
    Column("queue", String(MAX_NAME), primary_key=True),
    Column("key", String(MAX_FAIR_KEY), primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("refilled_at", Time, nullable=False),
)

# Dependencies (store/dependencies.py): child `child_id` runs after `parent_id` has succeeded, or, with
# `after_ended`, once it has ended whatever the outcome. Written with the child, never changed after.
deps = Table(
    "qp_deps",
    metadata,
    Column("parent_id", Id, primary_key=True, autoincrement=False),
    Column("child_id", Id, primary_key=True, autoincrement=False),
    Column("after_ended", Boolean, nullable=False, default=False),
    Index("ix_qp_deps_child", "child_id"),
)

# Workflows and groups (store/flows.py): jobs enqueued together in one call, as named steps or as a group whose
# callback job runs once all its members have ended.
flows = Table(
    "qp_flows",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False),  # workflow | group
    Column("name", String(200), nullable=True),
    Column("created_at", Time, nullable=False),
    Column("total", Integer, nullable=False),
    Column("callback_id", Id, nullable=True),
    Index("ix_qp_flows_callback", "callback_id"),
)

flow_jobs = Table(
    "qp_flow_jobs",
    metadata,
    Column("flow_id", Id, primary_key=True, autoincrement=False),
    Column("job_id", Id, primary_key=True, autoincrement=False),
    Column("step", String(200), nullable=True),  # a workflow's step name; None for a group's member
    Index("ix_qp_flow_jobs_job", "job_id"),
)

history = Table(
    "qp_history",
    metadata,
    # Per queue, per minute (`step` 60) or, past a day, per hour (3600): what the farm did (store/stats.py). `at` is
    # the bucket's start, epoch seconds of database time.
    Column("queue", String(MAX_NAME), primary_key=True),
    Column("step", Integer, primary_key=True, autoincrement=False),
    Column("at", BigInteger, primary_key=True, autoincrement=False),
    # The count of each ending; `snoozed` (schema 15) has a server default, so that an older node's rows fill it.
    *(
        Column(name, Integer, nullable=False, server_default="0" if name == Outcome.SNOOZED else None)
        for name in HISTORY_COUNTS
    ),
    Column("waiting", Integer, nullable=True),  # queued jobs as the bucket was written (an hour: its peak)
    Column("running", Integer, nullable=True),  # running jobs, likewise
    Column("p50", Float, nullable=True),  # seconds a run that ended in the bucket took: median, 95th percentile
    Column("p95", Float, nullable=True),
    # The highest job id counted as enqueued so far: the next minute counts the jobs above it (qp_jobs has no
    # index on created_at, whose every job update would add an entry).
    Column("last_job", Id, nullable=False),
    Index("ix_qp_history_at", "at"),
)

events = Table(
    "qp_events",
    metadata,
    # The farm's log of what happened and who did it (store/events.py), kept `keep_events` seconds.
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("at", Time, nullable=False),
    Column("kind", String(32), nullable=False),  # rules.events.EventKind
    Column("subject", String(400), nullable=False),  # what it happened to: a machine, a queue, a schedule
    Column("detail", String(2000), nullable=True),
    Column("actor", String(400), nullable=True),  # who did it: a machine, or the program, host and pid of a client
    Index("ix_qp_events_at", "at"),
)


def _by_day(table: Table, connection: Any, **_: Any) -> None:
    """PostgreSQL: the history and the event log are partitioned by day of `at`, dropped whole past their keep
    (store/partitions.py); their key holds `at` there (events: (id, at); the sequence keeps ids unique)."""
    if connection.dialect.name == "postgresql":
        partition(connection, table)


for _log in (history, events):
    event.listen(_log, "after_create", _by_day)
