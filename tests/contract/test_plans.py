"""The statements a busy node runs for every batch find their jobs by primary key on PostgreSQL whatever the table's
statistics say: right after a backlog was enqueued in one go, before any analyse, a finish or a renewal that read
the whole of qp_jobs would cost the size of the table per batch (sql.runs.by_id)."""

import json

import pytest
from sqlalchemy import text

from queueprocessor.farm import Farm
from queueprocessor.rules.job import Ending, JobSpec
from queueprocessor.rules.states import Outcome
from queueprocessor.store.progress import progress_arrays, progress_renew_statement
from queueprocessor.store.sql.claim import claim_statement
from queueprocessor.store.sql.runs import finish_params, finish_statement, renew_params, renew_statement
from queueprocessor.store.types import ClaimRequest, Progress

BACKLOG = 100_000
BATCH = 1_000


def scans(plan: dict) -> list[tuple[str, str | None]]:
    """Every (node type, relation) in a JSON plan, its subplans and CTEs included."""
    found = [(plan["Node Type"], plan.get("Relation Name"))]
    for child in plan.get("Plans", []):
        found += scans(child)
    return found


def planned(engine, statement, params) -> list[tuple[str, str | None]]:
    """The plan PostgreSQL makes for `statement` with `params`, compiled and bound as the store sends it (Raw)."""
    compiled = statement.compile(dialect=engine.dialect)
    with engine.connect() as conn:
        with conn.begin():
            conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")  # as on a node's connections
            [[plan]] = conn.exec_driver_sql(
                "EXPLAIN (FORMAT JSON) " + compiled.string, compiled.construct_params(params)
            ).all()
            conn.rollback()
    if isinstance(plan, str):
        plan = json.loads(plan)
    return scans(plan[0]["Plan"])


def conn_rows(engine, sql: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.exec_driver_sql(sql)]


@pytest.mark.postgres
def test_a_batch_is_claimed_renewed_and_finished_by_primary_key_on_a_never_analysed_table(pg_url):
    with Farm(pg_url) as farm:
        store, engine = farm._store, farm._engine
        with engine.begin() as conn:
            leaves = conn.execute(text("SELECT relid::text FROM pg_partition_tree('qp_jobs') WHERE isleaf")).scalars()
            for leaf in list(leaves):
                conn.execute(text(f"ALTER TABLE {leaf} SET (autovacuum_enabled = off)"))
        store.jobs.enqueue(JobSpec(executor="python", target="bench.jobs:noop"), count=BACKLOG)
        with engine.connect() as conn:
            [[analysed]] = conn.execute(
                text(
                    "SELECT bool_or(last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL) FROM pg_stat_user_tables "
                    "WHERE relname LIKE 'qp\\_jobs%'"
                )
            ).all()
        assert not analysed
        me = store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=BATCH)
        request = ClaimRequest(me, BATCH, lease=60)
        turn = store.claim_shape(BATCH, turn=True, **request.shape())
        plans = {
            "claim": planned(engine, claim_statement(store.claim_shape(BATCH, **request.shape())), request.params()),
            "turn": planned(engine, claim_statement(turn), request.params() | dict(b_slot=1, b_ends=None)),
        }
        claimed = store.jobs.claim(request)
        assert len(claimed) == BATCH
        held = [(job.id, job.fence) for job in claimed]
        news = {held[0]: Progress(0.5, "half")}
        endings = [Ending(job, Outcome.SUCCEEDED) for job in claimed]
        plans["renew"] = planned(engine, renew_statement(), renew_params(me, held, 60))
        plans["progress"] = planned(
            engine, progress_renew_statement(), renew_params(me, held, 60) | progress_arrays(held, news)
        )
        plans["finish"] = planned(engine, finish_statement(), finish_params(me, endings))
        plans["successes"] = planned(engine, finish_statement(True), finish_params(me, endings, True))
        # qp_jobs is partitioned by range of id (store/job_partitions.py): the backlog is all in the open range's
        # partition, and an empty partition may be read whole (no page at all).
        [open_range] = {relation for (relation,) in conn_rows(engine, "SELECT tableoid::regclass::text FROM qp_jobs")}
        for name, plan in plans.items():
            assert ("Seq Scan", open_range) not in plan, f"the {name} reads the whole of qp_jobs: {plan}"
        for name in ("renew", "progress", "finish", "successes"):
            assert ("Index Scan", open_range) in plans[name], plans[name]
        # The claim's update is the statement itself, its rows returned as written, not scanned again by a SELECT
        # around it (sql.claim._one_of: the picked ids as one array, looked up by key).
        assert plans["claim"][0] == ("ModifyTable", "qp_jobs"), plans["claim"]
        # The statements do what they are planned for: every job of the batch renewed, then finished.
        assert len(store.runs.renew(me, held, 60)) == BATCH
        assert store.runs.finish_many(me, endings) == ["succeeded"] * BATCH
