"""The node's threads and its lifecycle on each backend: a start that fails undoes itself."""

import threading

import pytest
from sqlalchemy import exc, text

from queueprocessor.farm import Farm
from queueprocessor.states import MachineState
from tests.support.work import FAST

# The database refuses the first check-in (an UPDATE that says the machine is active) but lets the
# registration (an INSERT) and the undo (an UPDATE to 'stopped') through: the failure lands exactly
# between registering and checking in.
REFUSE_CHECKIN = {
    "sqlite": ["CREATE TRIGGER refuse_checkin BEFORE UPDATE ON qp_machines WHEN NEW.state = 'active' "
               "BEGIN SELECT RAISE(ABORT, 'check-in refused by the test'); END"],
    "postgresql": ["CREATE FUNCTION refuse_checkin() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                   "RAISE EXCEPTION 'check-in refused by the test'; END $$",
                   "CREATE TRIGGER refuse_checkin BEFORE UPDATE ON qp_machines FOR EACH ROW "
                   "WHEN (NEW.state = 'active') EXECUTE FUNCTION refuse_checkin()"],
}


# PostgreSQL: the server drops the connection under the first check-in (the node sees the database out of
# reach, as when a server restarts), and the undo reaches it on a new connection.
DROP_AT_CHECKIN = ["CREATE FUNCTION drop_checkin() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                   "PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$",
                   "CREATE TRIGGER drop_checkin BEFORE UPDATE ON qp_machines FOR EACH ROW "
                   "WHEN (NEW.state = 'active') EXECUTE FUNCTION drop_checkin()"]


def install(farm, statements: list[str]) -> None:
    with farm.engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))


def node_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("qp-") and t.is_alive()]


def test_a_start_whose_check_in_fails_leaves_nothing_running(farm):
    install(farm, REFUSE_CHECKIN[farm.engine.dialect.name])
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
