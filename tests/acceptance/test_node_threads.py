"""The node's threads and its lifecycle on real databases: a start that fails undoes itself, and the
interleavings of threads that once wrote the same fields (see node.py's table of owners) end right.

Each interleaving is forced, not hoped for: a thread is held at a seam (a log line it writes, a statement
it runs) while the test makes the other thread act, then let go."""

import logging
import threading
from contextlib import contextmanager

import pytest
from sqlalchemy import event, exc, text

from queueprocessor.farm import Farm
from queueprocessor.node.push import BACKLOG
from queueprocessor.rules.states import JobState, MachineState
from tests.support.work import FAST, PYJOBS, Nodes, wait_for

# The database refuses the first check-in (an UPDATE that says the machine is active) but lets the
# registration (an INSERT) and the undo (an UPDATE to 'stopped') through: the failure lands exactly
# between registering and checking in.
REFUSE_CHECKIN = {
    "sqlite": [
        "CREATE TRIGGER refuse_checkin BEFORE UPDATE ON qp_machines WHEN NEW.state = 'active' "
        "BEGIN SELECT RAISE(ABORT, 'check-in refused by the test'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse_checkin() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'check-in refused by the test'; END $$",
        "CREATE TRIGGER refuse_checkin BEFORE UPDATE ON qp_machines FOR EACH ROW "
        "WHEN (NEW.state = 'active') EXECUTE FUNCTION refuse_checkin()",
    ],
}


# PostgreSQL: the server drops the connection under the first check-in (the node sees the database out of
# reach, as when a server restarts), and the undo reaches it on a new connection.
DROP_AT_CHECKIN = [
    "CREATE FUNCTION drop_checkin() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$",
    "CREATE TRIGGER drop_checkin BEFORE UPDATE ON qp_machines FOR EACH ROW "
    "WHEN (NEW.state = 'active') EXECUTE FUNCTION drop_checkin()",
]


def install(farm, statements: list[str]) -> None:
    with farm._engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))


def node_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("qp-") and t.is_alive()]


def test_a_start_whose_check_in_fails_leaves_nothing_running(farm):
    install(farm, REFUSE_CHECKIN[farm._engine.dialect.name])
    assert_start_undone(farm, exc.DatabaseError, "check-in refused by the test")


@pytest.mark.postgres
def test_a_start_whose_connection_drops_at_check_in_leaves_nothing_running(pg_url):
    with Farm(pg_url) as farm:
        install(farm, DROP_AT_CHECKIN)
        assert_start_undone(farm, exc.OperationalError, "terminating connection")


def assert_start_undone(farm, error: type[Exception], message: str) -> None:
    before = node_threads()
    node = farm.node(name="doomed", **FAST)
    with pytest.raises(error, match=message):
        node.start()
    assert node_threads() == before, "the runner's loop (or another node thread) was left running"
    [row] = farm.status()["machines"]
    assert (row["name"], row["status"]) == ("doomed", MachineState.STOPPED)
    assert node.stopped.is_set() and node.state == MachineState.STOPPED
    node.stop(drain=False)  # a stop after a failed start has nothing left to do, and says nothing fails


@pytest.fixture
def nodes(farm, http_target):
    started = Nodes(farm, http_base=http_target.base_url)
    yield started
    started.stop_all()


class HoldAt(logging.Handler):
    """Holds the thread that logs a message containing `text` until `let_go` is set: a seam between a
    decision a thread has logged and what it does next."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text
        self.reached = threading.Event()
        self.let_go = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage() and not self.reached.is_set():
            self.reached.set()
            self.let_go.wait(10)


@contextmanager
def holding(text: str):
    """The node's threads are held at the log line containing `text` until the test lets go (at the end)."""
    hold, logger = HoldAt(text), logging.getLogger("queueprocessor.node")
    logger.addHandler(hold)
    try:
        yield hold
    finally:
        hold.let_go.set()
        logger.removeHandler(hold)


def test_a_stop_that_comes_during_start_waits_for_it_then_leaves(farm, caplog):
    """A signal stops the node while start() is still checking in: the start completes, then the node
    leaves, and nothing it started is left running."""
    caplog.set_level(logging.INFO, logger="queueprocessor.node")
    before = node_threads()
    node = farm.node(name="hasty", **FAST)
    errors = []
    starting = threading.Thread(target=lambda: errors.extend(_raised(node.start)), name="test-start")
    stopping = threading.Thread(target=lambda: errors.extend(_raised(node.stop)), name="test-stop")
    with holding("database reachable") as hold:
        starting.start()
        assert hold.reached.wait(10), "the start never checked in"
        stopping.start()
        wait_for(lambda: node._stopping)
    starting.join(10)
    stopping.join(15)
    assert errors == []
    assert node.stopped.is_set() and node_threads() == before
    assert farm._store.machines.find(str(node.id))["state"] == MachineState.STOPPED


def _raised(call) -> list[Exception]:
    try:
        call()
    except Exception as error:
        return [error]
    return []


def test_a_wish_that_comes_while_stop_drains_cannot_bring_the_node_back(farm, nodes, caplog):
    """The heartbeat decides to apply an operator's resume, stop() begins a drain, then the heartbeat goes
    on: the node stays draining (on its row too), finishes its job and stops."""
    caplog.set_level(logging.INFO, logger="queueprocessor.node")
    node = nodes("a")
    [job_id] = farm.enqueue_http("/sleep/3")
    wait_for(lambda: farm._store.jobs.get(job_id)["state"] == JobState.RUNNING)
    farm.steer("a", "pause")
    wait_for(lambda: node.state == MachineState.PAUSED)
    stopping = threading.Thread(target=node.stop, name="test-drain")
    with holding("operator wish: resume") as hold:
        farm.steer("a", "resume")
        assert hold.reached.wait(5), "the heartbeat never came to the wish"
        stopping.start()
        wait_for(lambda: node.state == MachineState.DRAINING)
        hold.let_go.set()
        wait_for(lambda: farm._store.machines.find(str(node.id))["wish"] is None)  # that check-in is written
        assert node.state == MachineState.DRAINING
        assert farm._store.machines.find(str(node.id))["state"] == MachineState.DRAINING
    stopping.join(15)
    assert node.stopped.is_set()
    assert farm._store.jobs.get(job_id)["state"] == JobState.SUCCEEDED, "a drain finishes the running job"
    assert farm._store.machines.find(str(node.id))["state"] == MachineState.STOPPED


def test_a_backlog_notice_that_comes_while_the_turn_thread_resets_is_kept(tmp_path):
    """A direct claim comes back empty and the turn thread resets its backlog; a backlog notice that came
    in during that claim still makes it claim again, and the job due by then runs without waiting for a
    turn (the period is an hour, so the node's first turn is its only one)."""
    with Farm(f"sqlite:///{tmp_path / 'farm.db'}") as farm:
        nodes = Nodes(farm, period=3600.0)
        try:
            node = nodes("a")
            wait_for(lambda: node.turns.taken == 1)
            [job_id] = farm.enqueue(farm.python_spec(f"{PYJOBS}:echo", "late"), delay=0.5)
            due = farm._store.jobs.get(job_id)["run_at"]

            def during_the_empty_claim(conn, cursor, statement, *_):
                if (
                    threading.current_thread().name == "qp-turns"
                    and statement.lstrip().startswith("UPDATE")
                    and "qp_jobs" in statement
                    and not hold.is_set()
                ):
                    hold.set()  # this claim looked before the job was due, and will come back empty
                    wait_for(lambda: node.estimator.db_now() > due + 0.05)
                    node.turns.notice(BACKLOG)  # as the listener thread does

            hold = threading.Event()
            event.listen(farm._engine, "after_cursor_execute", during_the_empty_claim)
            try:
                node.turns.notice(BACKLOG)
                wait_for(hold.is_set, timeout=5)
                wait_for(lambda: farm._store.jobs.get(job_id)["state"] == JobState.SUCCEEDED, timeout=5)
            finally:
                event.remove(farm._engine, "after_cursor_execute", during_the_empty_claim)
            assert node.turns.taken == 1, "the job was claimed directly, not on a turn"
        finally:
            nodes.stop_all()


def test_a_check_in_wakes_the_turn_timer_only_when_its_plan_may_change(farm, monkeypatch):
    """The turn timer sleeps until its turn or the roster's next change; a check-in wakes it to plan again
    only when it brought something new: new rows, a new suspect, a new state, a backlog to help with.
    (The node's threads are not started: the test makes each check-in itself.)"""
    from queueprocessor.node.node import Node

    monkeypatch.setattr(Node, "_start_threads", lambda node: None)
    node = Nodes(farm)("a")
    try:
        node.turns.wake.clear()
        node.heartbeat.checkin()
        assert not node.turns.wake.is_set(), "nothing changed: the timer's plan stands"
        farm._store.machines.register(name="b", host="h", instance="b", pid=1, version="t", capacity=1)
        node.heartbeat.checkin()
        assert node.turns.wake.is_set(), "a machine joined: new rows"
        node.turns.wake.clear()
        node.heartbeat.checkin()
        assert not node.turns.wake.is_set()
        farm.steer("a", "pause")
        node.heartbeat.checkin()
        assert node.turns.wake.is_set() and node.state == MachineState.PAUSED, "a new state"
        node.heartbeat.checkin()  # reads the rows again: writing its new state bumped the roster version
        node.turns.wake.clear()
        node.heartbeat.checkin()
        assert not node.turns.wake.is_set()
        slot = int(farm._store.ask_time() / FAST["period"])
        farm._store.turns.take(slot, node.id)
        farm._store.turns.record(slot, claimed=4, backlog=True)
        node.heartbeat.checkin()
        assert node.turns.wake.is_set(), "a backlog others may help with"
    finally:
        node.stop(drain=False)
