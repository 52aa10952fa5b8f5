"""The statements of named queues that operators and dashboards run (docs/design.md §9): their settings rows in
qp_queues, and what waits and runs in each. The claim's own queue guards are in sql/gates.py."""

import time
from dataclasses import fields
from typing import Any

from sqlalchemy import case, delete, exc, func, insert, select, text, update

from ..rules.breaker import Breaker, Flow, rate_text
from ..rules.events import EventKind
from ..rules.fairness import KeyUse
from ..rules.queues import DEFAULT, OnFailure, QueueInfo, Rate, keep_text, served_names, serving_machines
from ..rules.states import JobState
from . import key_flow
from .base import StoreBase
from .dbtime import db_now
from .events import record_event
from .schema import jobs, key_buckets, machines, queues
from .sql.fair import key_use, retag_statements
from .sql.gates import recount_statement, regate_statements

# The settings that hold a queue's jobs back (see sql.gates.gated_now): a change of one sets their flags again.
HOLDING = frozenset({"paused", "max_running", "rate_count", "breaker_failures", "fair", "key_limit", "key_rate_count"})
# The settings a node's breaker writes read (store/breakers.py): a change of one moves the row's flow_version.
FLOW = frozenset({"rate_count", *(f.name for f in fields(Flow))})
# How long a change of those waits for older transactions before it sets the flags (see QueueStore._regate).
PATIENCE = 5.0

# PostgreSQL: is a transaction of another client of this database older than `b_since` (database time) still
# open? (pg_stat_activity shows another role's sessions without their times: those are not waited for.)
_OLDER_OPEN = text(
    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
    "AND backend_type = 'client backend' AND pid <> pg_backend_pid() "
    "AND xact_start < to_timestamp(:b_since))"
)


class QueueStore:
    def __init__(self, store: StoreBase):
        self.store = store

    def settings(self, only: str | None = None) -> dict[str, dict[str, Any]]:
        """Every queue an operator has set something on (or only queue `only`): its qp_queues row, by name."""
        statement = select(queues) if only is None else select(queues).where(queues.c.name == only)
        return {row.name: dict(row._mapping) for row in self.store.rows(statement)}

    def counts(self, only: str | None = None) -> dict[str, tuple[int, int, int]]:
        """Per queue with work (or only queue `only`): (waiting, running, order keys waiting)."""
        waiting = jobs.c.state == JobState.QUEUED
        statement = (
            select(
                jobs.c.queue,
                func.sum(case((waiting, 1), else_=0)),
                func.sum(case((waiting, 0), else_=1)),
                func.count(case((waiting, jobs.c.order_key)).distinct()),
            )
            .where(jobs.c.state.in_((JobState.QUEUED, JobState.RUNNING)))
            .group_by(jobs.c.queue)
        )
        if only is not None:
            statement = statement.where(jobs.c.queue == only)
        return {row[0]: (int(row[1]), int(row[2]), row[3]) for row in self.store.rows(statement)}

    def known(self, name: str) -> bool:
        """Is this queue `default` (always listed: see infos), or has it been set, served by name, or given a job (of
        any state)?"""
        if name == DEFAULT or self.store.rows(select(queues.c.name).where(queues.c.name == name)):
            return True
        if self.store.rows(select(jobs.c.id).where(jobs.c.queue == name).limit(1)):
            return True
        served = self.store.rows(select(machines.c.queues).where(machines.c.queues != ""))
        return any(name in served_names(row[0]) for row in served)

    def put(self, name: str, **values: Any) -> None:
        """Set a queue's settings (its row made at first), stamped with the database's time so every node sees
        the change at its next heartbeat. A limit comes with its running count, counted under the row's lock."""
        values["changed_at"] = db_now()
        try:
            self._write(name, values)
        except exc.IntegrityError:  # made by another operator meanwhile: ours is the later change
            self._write(name, values)
        if HOLDING & values.keys():
            self._regate(name)

    def _regate(self, name: str) -> None:
        """Set the gated flag of queue `name`'s unfinished jobs to what its row says now (sql.gates.gated_now).
        An enqueue that read the row before our change may not have committed yet, and its job would miss this
        update: on PostgreSQL we first wait, as CREATE INDEX CONCURRENTLY does, for every transaction that began
        before the change to end, for at most PATIENCE seconds (a job that still slips through, by a client
        holding a transaction open that long, is set right by the next housekeeping pass: recount). On SQLite
        a write waits for the one before it; on SQL Server the update waits for the rows others are inserting."""
        if self.store.dialect == "postgresql":
            since = self.store.ask_time()
            deadline = time.monotonic() + PATIENCE
            while self.store.rows(_OLDER_OPEN, dict(b_since=since))[0][0] and time.monotonic() < deadline:
                time.sleep(0.01)
        with self.store.engine.begin() as conn:
            for statement in (*regate_statements(one=True), *retag_statements()):
                conn.execute(statement, dict(b_queue=name))

    def _write(self, name: str, values: dict[str, Any]) -> None:
        with self.store.engine.begin() as conn:
            moved = dict(flow_version=func.coalesce(queues.c.flow_version, 0) + 1) if FLOW & values.keys() else {}
            if not conn.execute(update(queues).where(queues.c.name == name).values(**values, **moved)).rowcount:
                conn.execute(insert(queues).values(name=name, **values))
            if values.get("max_running") is not None:
                conn.execute(recount_statement(one=True), dict(b_queue=name))
            if "key_rate_count" in values:  # a new rate per key starts every key with a full bucket
                conn.execute(delete(key_buckets).where(key_buckets.c.queue == name))
            for kind, detail in _changes(values):
                record_event(conn, kind, name, detail, self.store.actor)

    def recount(self) -> None:
        """Count every limited queue's running jobs afresh (housekeeping), under their rows' lock, taken in name
        order as claims take it: a count that went wrong is repaired. Every statement that moves a limited
        queue's job into or out of running moves its count in the same transaction, so none should; but a
        claim planned just before a limit was set, or a node of an older version, starts jobs uncounted.
        Gated flags are set right too, for a job that slipped past its queue's change (see _regate), and full
        buckets of rates per key are forgotten (key_flow.forget_full)."""
        with self.store.engine.begin() as conn:
            conn.execute(
                select(queues.c.name).where(queues.c.max_running.isnot(None)).order_by(queues.c.name).with_for_update()
            )
            conn.execute(recount_statement())
        with self.store.engine.begin() as conn:
            for statement in regate_statements():
                conn.execute(statement)
            key_flow.forget_full(conn)

    def keys(self, name: str, most: int) -> list[KeyUse]:
        """The `most` busiest fairness keys of queue `name` (most units running, then most waiting), each with its
        bucket's tokens if the queue has a rate per key."""
        use = key_use(self.store.dialect, name, most)
        return [
            KeyUse(key, int(running), int(waiting), tokens) for key, running, waiting, tokens in self.store.rows(use)
        ]

    def infos(self, live: list[dict[str, Any]], only: str | None = None) -> list[QueueInfo]:
        """Every queue with work, settings or a live machine serving it by name (and `default`), by name; or only
        queue `only`, whose settings and counts alone are read. `live`: the machine rows judged alive, each with
        its `name` and `queues` (names, () for every queue)."""
        settings, counts = self.settings(only), self.counts(only)
        names = {DEFAULT, *settings, *counts, *(q for m in live for q in m["queues"])} if only is None else {only}
        infos = []
        for name in sorted(names):
            row = settings.get(name, {})
            waiting, running, keys = counts.get(name, (0, 0, 0))
            infos.append(
                QueueInfo(
                    name=name,
                    waiting=waiting,
                    running=running,
                    limit=row.get("max_running"),
                    rate=_rate(row),
                    order_keys_waiting=keys,
                    paused=bool(row.get("paused")),
                    on_failure=OnFailure(row.get("on_failure") or OnFailure.SKIP),
                    serving=serving_machines(live, name),
                    keep=row.get("keep"),
                    fair=bool(row.get("fair")),
                    key_limit=row.get("key_limit"),
                    fair_from=row.get("fair_from"),
                    key_rate=Rate(row["key_rate_count"], row["key_rate_per"]) if row.get("key_rate_count") else None,
                    **_flow(row),
                )
            )
        return infos


def _rate(row: dict[str, Any]) -> Rate | None:
    """A queue row's configured rate (the ceiling, while its current rate is lowered)."""
    return Rate(row["rate_count"], row.get("rate_set_per") or row["rate_per"]) if row.get("rate_count") else None


def _flow(row: dict[str, Any]) -> dict[str, Any]:
    """What QueueInfo shows of a queue row's breaker and adaptive rate."""
    breaker = row.get("breaker_failures") is not None
    return dict(
        breaker=str(Breaker(row["breaker_failures"], row["breaker_window"])) if breaker else None,
        cool_down=Flow.of(row).cool_down if breaker else None,
        breaker_state=Flow.of(row).state if breaker else None,
        failures=row.get("breaker_count") or 0,
        adaptive_floor=row.get("adapt_floor"),
        current_rate=row["rate_count"] / row["rate_per"] if row.get("rate_count") else None,
    )


def _changes(values: dict[str, Any]) -> list[tuple[EventKind, str | None]]:
    """The events a change of a queue's settings logs: one for each thing it changed."""
    found: list[tuple[EventKind, str | None]] = []
    if "paused" in values:
        found.append((EventKind.QUEUE_PAUSED if values["paused"] else EventKind.QUEUE_RESUMED, None))
    if "max_running" in values:
        limit = values["max_running"]
        found.append((EventKind.QUEUE_LIMITED, "no limit" if limit is None else f"at most {limit} running"))
    if "rate_count" in values:
        count, per = values["rate_count"], values["rate_per"]
        found.append((EventKind.QUEUE_RATED, "no rate" if count is None else f"{count} starts per {per:g} s"))
    if "on_failure" in values:
        found.append((EventKind.QUEUE_ON_FAILURE, f"on failure: {values['on_failure']}"))
    if "fair" in values:
        found.append((EventKind.QUEUE_FAIR, "fair share by key" if values["fair"] else "priority, then age"))
    if "key_limit" in values:
        limit = values["key_limit"]
        found.append((EventKind.QUEUE_KEY_LIMITED, "no limit per key" if limit is None else f"at most {limit} per key"))
    if "fair_from" in values:
        source = values["fair_from"]
        found.append((EventKind.QUEUE_FAIR, f"fairness key of jobs without one: {source or 'none'}"))
    if "key_rate_count" in values:
        count, per = values["key_rate_count"], values["key_rate_per"]
        said = "no rate per key" if count is None else f"{count} starts per {per:g} s per key"
        found.append((EventKind.QUEUE_KEY_RATED, said))
    if "keep" in values:
        found.append((EventKind.QUEUE_KEEP, f"finished jobs kept: {keep_text(values['keep'])}"))
    if "breaker_failures" in values:
        failures = values["breaker_failures"]
        said = "no breaker" if failures is None else f"{failures} failures within {values['breaker_window']:g} s"
        found.append((EventKind.QUEUE_BREAKER, said))
    if "breaker_cooldown" in values:
        found.append(
            (EventKind.QUEUE_BREAKER, f"cool-down {Flow(breaker_cooldown=values['breaker_cooldown']).cool_down:g} s")
        )
    if "adapt_floor" in values:
        floor = values["adapt_floor"]
        found.append((EventKind.QUEUE_ADAPTIVE, "not adaptive" if floor is None else f"floor {rate_text(floor)}"))
    return found
