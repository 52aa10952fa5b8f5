"""Named queues: names, roles, pause, limits, rates and order keys, on each backend.

The claim's guards are tested on the store, where a test decides who claims when; the behaviour across
machines with in-process nodes (roles, pause) here, and with real node processes killed mid-run in
test_queues_farm.py.
"""

import psycopg
import pytest
from sqlalchemy import event, update
from sqlalchemy.dialects.mssql import pyodbc

from queueprocessor.farm import Farm
from queueprocessor.rules.errors import BadQueueInput, NotFound
from queueprocessor.rules.job import JobSpec
from queueprocessor.rules.queues import OnFailure, QueueInfo, Rate, Served
from queueprocessor.rules.roster import slot_of
from queueprocessor.store.schema import jobs
from queueprocessor.store.sql.claim import ClaimShape, claim_statement
from queueprocessor.store.sql.gates import freed_statement, recount_statement, regate_statements, taken_statement
from queueprocessor.store.sql.turns import looks_statement, turn_statement
from queueprocessor.store.types import ClaimRequest, Looks, Plan, Turn
from tests.support.httptarget import most_at_once
from tests.support.work import PYJOBS, Nodes, run_cli, wait_for

NOOP = f"{PYJOBS}:noop"


def spec(queue="default", order_key=None, **extra) -> JobSpec:
    return JobSpec("python", NOOP, queue=queue, order_key=order_key, **extra)


def machine(farm, name="m", queues="") -> int:
    return farm._store.machines.register(
        name=name, host="h", instance=f"{name}-i", pid=1, version="t", capacity=8, queues=queues
    )


def test_names_rates_and_served_lists_are_checked_before_anything_is_written():
    assert Rate.parse("10/s") == Rate(10, 1.0) and str(Rate.parse(" 3 / min ")) == "3/min"
    assert Served.parse("reports:2, default") == Served(("reports", "default"), (("reports", 2),))
    assert str(Served.parse("reports:2,default")) == "reports:2,default" and Served.parse(None).every
    for bad in ("ten/s", "5/fortnight", "0/s", "/s", "10"):
        with pytest.raises(BadQueueInput, match="is not a rate"):
            Rate.parse(bad)
    for bad in (",", " , ", "a b", "x" * 65, "reports:0", "reports:two", "-x"):
        with pytest.raises(BadQueueInput):
            Served.parse(bad)


def test_a_claim_takes_only_the_queues_it_serves(farm):
    reports = farm._store.jobs.enqueue(spec("reports"), count=2)
    plain = farm._store.jobs.enqueue(spec(), count=2)
    me = machine(farm, queues="reports")
    assert {job.id for job in farm._store.jobs.claim(ClaimRequest(me, 8, 30.0, plan=Plan(served=("reports",))))} == set(
        reports
    )
    assert {job.queue for job in farm._store.jobs.claim(ClaimRequest(me, 8, 30.0))} == {"default"}, (
        "every queue, by default"
    )
    assert farm._store.jobs.get(plain[0])["queue"] == "default"


def test_a_paused_queue_starts_nothing_until_resumed_and_others_go_on(farm):
    held = farm._store.jobs.enqueue(spec("reports"))[0]
    other = farm._store.jobs.enqueue(spec())[0]
    me = machine(farm)
    farm.pause_queue("reports")
    assert [job.id for job in farm._store.jobs.claim(ClaimRequest(me, 8, 30.0))] == [other]
    assert [q.paused for q in farm.queues() if q.name == "reports"] == [True]
    farm.resume_queue("reports")
    assert [job.id for job in farm._store.jobs.claim(ClaimRequest(me, 8, 30.0))] == [held]


def test_queue_list_says_what_waits_runs_and_who_serves(farm):
    farm._store.jobs.enqueue(spec("reports", order_key="a"), count=3)
    farm._store.jobs.enqueue(spec("reports", order_key="b"))
    farm.set_queue("reports", limit=2, rate="10/s", on_failure=OnFailure.BLOCK)
    machine(farm, "r1", queues="reports:1")
    machine(farm, "any")
    [default, reports] = farm.queues()
    assert reports == QueueInfo(
        name="reports",
        waiting=4,
        running=0,
        limit=2,
        rate=Rate(10, 1.0),
        order_keys_waiting=2,
        paused=False,
        on_failure=OnFailure.BLOCK,
        serving=("r1", "any"),
        current_rate=10.0,
    )
    assert default.serving == ("any",) and default.limit is None and default.on_failure == OnFailure.SKIP
    farm.set_queue("reports", limit=None)
    assert [q.limit for q in farm.queues()] == [None, None]
    assert farm.status()["machines"][0]["queues"] == ("reports",)
    assert [m["caps"] for m in farm.status()["machines"]] == [{"reports": 1}, {}]  # its own limit, published


def test_bad_queue_settings_change_nothing(farm):
    farm._store.jobs.enqueue(spec("reports"))
    farm.set_queue("reports", limit=3)
    for bad in (dict(limit=0), dict(limit=-1), dict(limit=2.5), dict(rate="ten/s"), dict(on_failure="retry")):
        with pytest.raises(BadQueueInput):
            farm.set_queue("reports", **bad)
    with pytest.raises(NotFound, match="no queue named 'reprots'"):
        farm.set_queue("reprots", limit=1)
    with pytest.raises(BadQueueInput):
        farm.enqueue_python(NOOP, queue="a b")
    with pytest.raises(BadQueueInput):
        farm.enqueue_python(NOOP, order_key="k" * 201)
    assert [(q.name, q.limit, q.waiting) for q in farm.queues()] == [("default", None, 0), ("reports", 3, 1)]


def test_jobs_of_an_order_key_start_one_at_a_time_in_enqueue_order(farm):
    store = farm._store
    a = store.jobs.enqueue(spec(order_key="a"), count=3)
    b = store.jobs.enqueue(spec(order_key="b"), count=2)
    loose = store.jobs.enqueue(spec())[0]
    me = machine(farm)
    first = {job.id: job for job in store.jobs.claim(ClaimRequest(me, 8, 30.0))}
    assert set(first) == {a[0], b[0], loose}, "the oldest of each key, and the job with none"
    assert store.jobs.claim(ClaimRequest(me, 8, 30.0)) == []
    store.runs.finish(first[a[0]], me, "succeeded")
    [second] = store.jobs.claim(ClaimRequest(me, 8, 30.0))
    assert second.id == a[1]
    store.runs.finish(second, me, "failed", error="boom", retry_in=0.0)  # attempts left: it holds its key
    [again] = store.jobs.claim(ClaimRequest(me, 8, 30.0))
    assert again.id == a[1] and again.attempts == 2


@pytest.mark.parametrize("policy", list(OnFailure))
def test_a_job_that_failed_for_good_blocks_its_key_or_not_as_the_queue_says(farm, policy):
    store = farm._store
    first, after = store.jobs.enqueue(spec(order_key="k", max_attempts=1), count=2)
    farm.set_queue("default", on_failure=policy)
    other = OnFailure.SKIP if policy == OnFailure.BLOCK else OnFailure.BLOCK
    store.jobs.enqueue(spec("strict"))
    farm.set_queue("strict", on_failure=other, limit=1)  # another queue's policy is its own
    me = machine(farm)
    [job] = store.jobs.claim(ClaimRequest(me, 8, 30.0))
    assert store.runs.finish(job, me, "failed", error="boom") == "failed"
    taken = [job.id for job in store.jobs.claim(ClaimRequest(me, 8, 30.0))]
    assert taken == ([] if policy == OnFailure.BLOCK else [after])
    if policy == OnFailure.BLOCK:
        farm.retry(first)  # an operator retries it: it runs first, then the key moves on
        [again] = store.jobs.claim(ClaimRequest(me, 8, 30.0))
        assert again.id == first and store.jobs.claim(ClaimRequest(me, 8, 30.0)) == []
        store.runs.finish(again, me, "succeeded")
        assert [job.id for job in store.jobs.claim(ClaimRequest(me, 8, 30.0))] == [after]


def test_a_farm_wide_limit_counts_running_jobs_and_leases_taken_over(farm):
    store = farm._store
    farm._store.jobs.enqueue(spec("reports"), count=5)
    farm.set_queue("reports", limit=2)
    a, b = machine(farm, "a"), machine(farm, "b")
    locked = Plan(alone=(("reports", 8, True),))
    assert store.jobs.claim(ClaimRequest(a, 8, 30.0)) == [], (
        "a claim that does not lock a limited queue takes none of it"
    )
    [first] = store.jobs.claim(ClaimRequest(a, 1, 30.0, plan=locked))
    assert len(store.jobs.claim(ClaimRequest(b, 8, 30.0, plan=locked))) == 1
    assert store.jobs.claim(ClaimRequest(b, 8, 30.0, plan=locked)) == [], "two running: the limit"
    store.count(update(jobs).where(jobs.c.id == first.id).values(lease_until=jobs.c.lease_until - 60))  # a dies
    assert store.jobs.claim(ClaimRequest(b, 8, 30.0, plan=locked, take_expired=False)) == [], (
        "its job counts until its fence moves"
    )
    taken = store.jobs.claim(ClaimRequest(b, 8, 30.0, plan=locked))
    assert [job.id for job in taken] == [first.id], "the expired lease is taken over, still within the limit"
    assert store.jobs.claim(ClaimRequest(b, 8, 30.0, plan=locked)) == []


def test_a_machine_takes_at_most_its_own_limit_of_a_queue(farm):
    farm._store.jobs.enqueue(spec("reports"), count=5)
    farm._store.jobs.enqueue(spec(), count=5)
    me = machine(farm, queues="reports:2,default")
    claimed = farm._store.jobs.claim(
        ClaimRequest(me, 6, 30.0, plan=Plan(("reports", "default"), (("reports", 2, False),)))
    )
    assert sorted(job.queue for job in claimed) == ["default"] * 4 + ["reports"] * 2


def test_a_rate_spends_tokens_in_the_claims_transaction(farm):
    farm._store.jobs.enqueue(spec("feed"), count=5)
    farm.set_queue("feed", rate="2/min")  # a bucket of one start: what a period brings, at least one
    me = machine(farm)
    locked = Plan(alone=(("feed", 8, True),))
    assert len(farm._store.jobs.claim(ClaimRequest(me, 8, 30.0, plan=locked))) == 1
    assert farm._store.jobs.claim(ClaimRequest(me, 8, 30.0, plan=locked)) == [], "no token left for half a minute"


def test_roles_work_of_a_queue_waits_for_a_machine_that_serves_it(farm, http_target):
    nodes = Nodes(farm, http_base=http_target.base_url)
    try:
        plain = nodes("plain", queues="default")
        [job] = farm.enqueue_python(NOOP, queue="reports")
        assert farm.serving("reports") == ()
        wait_for(lambda: plain.turns.taken >= 3)
        assert farm.job(job)["state"] == "queued", "no live machine serves reports: it waits"
        reporter = nodes("reporter", queues="reports:1")
        assert farm.serving("reports") == ("reporter",)
        done = farm.wait(job, timeout=20)
        assert done["state"] == "succeeded" and {r["machine_id"] for r in done["runs"]} == {reporter.id}
    finally:
        nodes.stop_all()


def test_a_paused_queue_is_applied_by_running_nodes_and_resumed(farm, http_target):
    nodes = Nodes(farm, http_base=http_target.base_url)
    try:
        nodes("n1", queues="reports,default")
        farm.pause_queue("reports")
        [held] = farm.enqueue_python(NOOP, queue="reports")
        [other] = farm.enqueue_python(NOOP)
        assert farm.wait(other, timeout=20)["state"] == "succeeded"
        assert farm.job(held)["state"] == "queued", "paused: nothing of it starts while other queues run"
        farm.resume_queue("reports")
        assert farm.wait(held, timeout=20)["state"] == "succeeded"
    finally:
        nodes.stop_all()


@pytest.mark.parametrize("served, branches", [(True, ()), (False, (True, False)), (True, (True,))])
def test_the_queue_guards_compile_for_sql_server_2017(served, branches):
    """No SQL Server runs here: the claim's queue shapes, the bucket's spending and the turn's looks compile to
    T-SQL without LEAST and GREATEST (SQL Server 2022 only): CASE instead, and no sub-select in OUTPUT; the
    gated flags are bits, set and compared as 1 and 0."""
    dialect = pyodbc.dialect()
    shape = ClaimShape("mssql", True, True, 4, served=served, branches=branches)
    claim = str(claim_statement(shape).compile(dialect=dialect))
    assert claim.startswith("UPDATE qp_jobs SET") and claim.count("WITH (UPDLOCK, ROWLOCK, READPAST)") == 2 + len(
        branches
    )
    assert claim.count("j.gated = 1") == branches.count(True) and claim.count("j.gated = 0") == 1 + branches.count(
        False
    )
    for regate in regate_statements():
        assert "gated=" in str(regate.compile(dialect=dialect)).replace(" ", "")
    assert ("qp_jobs.queue IN" in claim or "j.queue IN" in claim) == served
    spend = str(taken_statement("mssql").compile(dialect=dialect))
    assert "UPDATE qp_queues SET running" in spend and "tokens=" in spend
    for other in (freed_statement(), recount_statement(), recount_statement(one=True)):
        assert str(other.compile(dialect=dialect)).startswith("UPDATE qp_queues SET running")
    for sql in (claim, spend):
        assert "least(" not in sql.lower() and "greatest(" not in sql.lower()
    assert claim.count("CASE WHEN") >= 3 * len(branches)  # the room: at most mine, the limit's, the tokens', and >= 0
    turn = str(turn_statement("mssql", True, True, True).compile(dialect=dialect))
    assert turn.startswith("INSERT INTO qp_turns") and "OUTPUT" not in turn and "EXISTS" not in turn
    assert turn.endswith("< :b_ends")  # only while its slot lasts
    assert str(looks_statement("mssql", True, True).compile(dialect=dialect)).count("EXISTS (SELECT") >= 2


def test_enqueue_to_a_queue_nobody_serves_is_accepted_with_a_one_line_warning(db_url, capsys):
    assert run_cli("--db", db_url, "enqueue", "python", NOOP, "--queue", "reports", "--order-key", "k") == 0
    out, err = capsys.readouterr()
    assert out.startswith("enqueued job ") and err.strip().splitlines() == [
        "warning: no live machine serves queue 'reports' yet: its jobs wait until one does (node --queues)"
    ]
    with Farm(db_url) as farm:
        [job] = farm.list_jobs()
        assert (job["queue"], job["order_key"], job["state"]) == ("reports", "k", "queued")
        machine(farm, "r", queues="reports")
    assert run_cli("--db", db_url, "enqueue", "python", NOOP, "--queue", "reports") == 0
    assert capsys.readouterr().err == "", "served: no warning"


class Sent:
    """Every statement this process sends to the farm's database from now on, as the driver gets it (on
    PostgreSQL the hot statements bypass SQLAlchemy's execution, so they are seen at the driver's cursor)."""

    def __init__(self, engine):
        self.statements: list[str] = []
        if engine.dialect.name != "postgresql":
            event.listen(engine, "before_cursor_execute", lambda _conn, _cursor, sql, *_: self.statements.append(sql))
            return
        seen = self.statements

        class Counted(psycopg.Cursor):
            def execute(self, query, *args, **kwargs):
                seen.append(str(query))
                return super().execute(query, *args, **kwargs)

        # Every connection gets it at its next checkout, those already in the pool too.
        event.listen(
            engine.pool, "checkout", lambda dbapi_connection, *_: setattr(dbapi_connection, "cursor_factory", Counted)
        )

    def reading(self, table: str) -> list[str]:
        return [s for s in list(self.statements) if table in s]


def test_an_idle_farm_with_roles_and_a_limited_queue_polls_once_a_turn(farm, http_target):
    """Roles and a limited queue add no statement to an idle turn: what a turn-holder asks about work it does
    not claim rides in its turn's own statement (PostgreSQL: one statement a turn; elsewhere: the turn's
    record, then its claim)."""
    nodes = Nodes(farm, http_base=http_target.base_url, housekeeping=1e6)
    try:
        a, b = nodes("a", queues="qa"), nodes("b", queues="qb")
        farm.set_queue("qa", limit=2)
        wait_for(lambda: a.turns.taken >= 2 and b.turns.taken >= 2 and "qa" in a.queue_settings)  # in steady state
        sent = Sent(farm._engine)
        before = a.turns.taken + b.turns.taken
        wait_for(lambda: a.turns.taken + b.turns.taken >= before + 8)
        turns = a.turns.taken + b.turns.taken - before
        # The farm's history is written once a minute by that slot's turn-holder (docs/design.md §11): not a poll,
        # and in the window only when it crosses a minute.
        polls = [s for s in sent.reading("qp_jobs") if "qp_history" not in s]
    finally:
        nodes.stop_all()
    postgresql = farm._store.dialect == "postgresql"
    # Elsewhere the claim first reads whose runs it would end as lost (the expired leases it may take over).
    per_turn = 1 if postgresql else 3
    assert [
        s
        for s in polls
        if not (
            "INSERT INTO qp_turns" in s  # the turn (PostgreSQL: with its claim)
            or not postgresql
            and s.startswith(("UPDATE qp_jobs", "SELECT qp_jobs.id, qp_jobs.owner, qp_jobs.started_at"))
        )
    ] == []
    # A window cuts a turn at each end: a turn counted may have sent its statements before it opened.
    assert turns * per_turn - 2 * per_turn <= len(polls) <= (turns + 2) * per_turn


def test_a_job_of_a_queue_the_turn_holder_does_not_serve_starts_within_a_period(farm, http_target):
    """Two machines serve qa, one qb. A qb job due halfway into a slot after qb's machine held the turn (its
    claim ahead stopped short of it) is not that machine's until two slots later; the next turn-holder, which
    does not serve qb, sees it due and flags its turn, and the qb machine claims it directly in that slot."""
    period = 1.0
    nodes = Nodes(farm, http_base=http_target.base_url, period=period, heartbeat=0.2)
    try:
        a1, a2, b = nodes("a1", queues="qa"), nodes("a2", queues="qa"), nodes("b", queues="qb")
        wait_for(lambda: all(n.turns.taken for n in (a1, a2, b)), timeout=20)
        roster = sorted(n.id for n in (a1, a2, b))
        s = slot_of(farm._store.ask_time(), period) + 2
        while roster[(s - 1) % 3] != b.id:
            s += 1
        [job] = farm.enqueue_python(NOOP, queue="qb", at=(s + 0.5) * period)
        done = farm.wait(job, timeout=20)
        [run] = done["runs"]
        turns = {t["slot"]: t for t in farm._store.turns.read(since=(s - 1) * period)}
    finally:
        nodes.stop_all()
    assert run["machine_id"] == b.id
    started = slot_of(run["started_at"], period)
    assert started == s + 1, "started in the slot after it was due, before the qb machine's own turn"
    assert turns[started]["machine_id"] != b.id and turns[started]["backlog"]


def test_a_turn_of_a_node_with_a_limited_queue_claims_every_queue_in_one_order_of_priority(farm, http_target):
    """While a job of a limited queue is due, the turn claims nothing itself and the node makes one locked claim
    of every queue it serves, most urgent first: so the limited queue's urgent job starts before less urgent
    work of the others (it used to be claimed after them, with the room they left)."""
    low = farm.enqueue_python(NOOP, count=3)  # default queue, priority 0
    [urgent] = farm.enqueue_python(NOOP, priority=9)
    [limited, held] = farm.enqueue_python(NOOP, queue="limited", priority=5, count=2)
    farm.set_queue("limited", limit=1)
    nodes = Nodes(farm, http_base=http_target.base_url)
    try:
        nodes("n", capacity=2, queues="default,limited")
        assert all(farm.wait(job, timeout=20)["state"] == "succeeded" for job in [*low, urgent, limited, held])
    finally:
        nodes.stop_all()
    runs = sorted(farm._store.runs.read(), key=lambda r: r["started_at"])  # in the order they were claimed
    assert {r["job_id"] for r in runs[:2]} == {urgent, limited}, "the node's first claim: the two most urgent"
    assert held in {r["job_id"] for r in runs[2:]}


def test_a_node_working_off_a_backlog_with_a_limited_queue_never_runs_more_than_its_capacity(farm, http_target):
    """A place freed under a queue's limit and the room a backlog's claim fills were claimed in the same tick from
    one look at the room, so a node ran up to twice its capacity: now the place rides with the backlog's claim."""
    farm.enqueue_http("/ok", queue="limited")  # makes the queue known, then limit it
    farm.set_queue("limited", limit=1)
    ids = farm.enqueue_http("/sleep/0.03", count=60) + farm.enqueue_http("/sleep/0.02", queue="limited", count=30)
    nodes = Nodes(farm, http_base=http_target.base_url)
    try:
        nodes("n", capacity=2)
        assert all(farm.wait(job, timeout=30)["state"] == "succeeded" for job in ids)
    finally:
        nodes.stop_all()
    served = http_target.requests("/sleep")
    assert most_at_once([r for r in served if r["path"].startswith("/sleep/0.02")]) == 1, "the limit held"
    assert most_at_once(served) == 2, "and the node's capacity"


def test_a_turn_says_what_it_saw_of_work_it_does_not_claim(farm):
    store = farm._store
    me = machine(farm, "a", queues="qa,limited")
    plan = Plan(served=("qa", "limited"))
    looks = Looks(guarded=("limited",), elsewhere=("qb",), served=("qa", "limited"))
    assert store.jobs.take_turn_and_claim(1, ClaimRequest(me, 4, 30.0, plan=plan), looks=looks) == Turn(
        True, [], False, False
    )
    assert store.jobs.take_turn_and_claim(1, ClaimRequest(me, 4, 30.0, plan=plan), looks=looks) == Turn(False, [])
    store.jobs.enqueue(spec("qb"))
    farm.pause_queue("qb")
    assert (
        store.jobs.take_turn_and_claim(2, ClaimRequest(me, 4, 30.0, plan=plan), looks=looks).elsewhere_due is False
    ), "paused"
    farm.resume_queue("qb")
    farm.set_queue("limited", limit=1)
    [limited] = store.jobs.enqueue(spec("limited"))
    plain = store.jobs.enqueue(spec("qa"), count=2)
    turn = store.jobs.take_turn_and_claim(3, ClaimRequest(me, 4, 30.0, plan=plan), looks=looks)
    assert turn == Turn(True, [], True, True), "limited work due: the turn leaves every queue to a locked claim"
    joint = store.jobs.claim(ClaimRequest(me, 4, 30.0, plan=Plan(("qa", "limited"), (("limited", 4, True),))))
    assert sorted(job.id for job in joint) == sorted([limited, *plain])
    everyone = Looks(elsewhere=(), served=("qa", "limited"))  # a peer serves every queue
    assert store.jobs.take_turn_and_claim(4, ClaimRequest(me, 4, 30.0, plan=plan), looks=everyone) == Turn(
        True, [], None, True
    )


def test_an_enqueue_reads_the_machines_once_and_one_queue_is_read_alone(farm):
    machine(farm, "r", queues="reports")
    farm._store.jobs.enqueue(spec("other"), count=2)
    farm._store.jobs.enqueue(spec("reports"))
    sent = Sent(farm._engine)
    assert farm.submit(spec("reports")).served and not farm.submit(spec("nobody")).served
    assert len(sent.reading("qp_machines")) == 2, "one read of the machine rows per enqueue, for both questions"
    farm.set_queue("reports", limit=3)
    sent.statements.clear()
    info = farm.queue("reports")
    assert (info.name, info.limit, info.waiting, info.serving) == ("reports", 3, 2, ("r",))
    of_queues = sent.reading("qp_queues") + sent.reading("qp_jobs")
    assert of_queues and all("qp_queues.name = " in s or "qp_jobs.queue = " in s for s in of_queues), (
        "the one queue's settings and counts, not every queue's"
    )
    assert farm.queue("default").waiting == 0
