"""The app's link to a farm database (ui.connection) and its operator's commands (ui.commands), without the window:
a real database (a SQLite file; PostgreSQL behind a TCP proxy that can refuse connections), the real worker
thread, and the real Farm. The connection's state is the only thing the window reads about the link, so its
transitions are checked one by one, in the order they happen."""

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from queueprocessor import work_spec  # noqa: E402
from queueprocessor.farm import Farm  # noqa: E402
from queueprocessor.nodeoptions import NodeConfig  # noqa: E402
from queueprocessor.rules.states import JobState, MachineState, Wish  # noqa: E402
from ui.commands import Commands  # noqa: E402
from ui.connection import Connection, State  # noqa: E402
from ui.snapshot import Snapshot  # noqa: E402

WAIT = 30_000  # ms


@pytest.fixture
def link(qapp, qtbot):
    """Connections that record every state they enter, stopped (and their worker gone) at the end."""
    made = []

    def make(node_options=None):
        connection = Connection(node_options, interval=0.1)
        connection.seen = []
        connection.changed.connect(connection.seen.append)
        made.append(connection)
        return connection

    yield make
    for connection in made:
        connection.stop()
    for connection in made:
        qtbot.waitUntil(lambda c=connection: not c.live and (c.poller is None or not c.poller.running), timeout=WAIT)


def test_a_sqlite_farm_connects_moves_to_another_and_disconnects(tmp_path, link, qtbot):
    first, second = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    connection = link(NodeConfig(name="desk", capacity=1))
    snapshots = []
    connection.snapshot.connect(snapshots.append)
    assert connection.state is State.DISCONNECTED and not connection.live

    connection.open(first)
    qtbot.waitUntil(lambda: connection.state is State.CONNECTED and connection.node_id is not None, timeout=WAIT)
    assert connection.seen == [State.CONNECTING, State.CONNECTED]
    snap = snapshots[-1]
    assert isinstance(snap, Snapshot) and snap.own_id == connection.node_id
    assert [m["name"] for m in snap.machines] == ["desk"] and snap.own_row["status"] == MachineState.ACTIVE

    # Another database: the first worker stops this machine's node there before the second opens.
    left = connection.node_id
    connection.seen.clear()
    connection.open(second)
    assert connection.state is State.STOPPING and connection.live
    qtbot.waitUntil(lambda: connection.state is State.CONNECTED and connection.url == second, timeout=WAIT)
    assert connection.seen == [State.STOPPING, State.CONNECTING, State.CONNECTED]
    with Farm(first) as old:
        assert [(m["id"], m["state"]) for m in old.status()["machines"]] == [(left, MachineState.STOPPED)]

    connection.seen.clear()
    connection.stop()
    qtbot.waitUntil(lambda: connection.state is State.DISCONNECTED, timeout=WAIT)
    assert connection.seen == [State.STOPPING, State.DISCONNECTED] and not connection.poller.running
    with Farm(second) as farm:
        assert [m["state"] for m in farm.status()["machines"]] == [MachineState.STOPPED]
    # No worker to run a command: it fails at once, saying so, rather than wait for ever.
    answers = []
    connection.done.connect(lambda *answer: answers.append(answer))
    Commands(connection.act).cancel(1)
    assert answers == [("Cancel job 1", False, "not reading a farm now: open a database (File ▸ Open Database…)")]


def test_watching_a_file_with_no_farm_ends_with_one_line_and_opening_again_connects(tmp_path, link, qtbot):
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    connection = link()  # only watching: it may create nothing
    connection.open(url)
    qtbot.waitUntil(lambda: connection.state is State.ENDED, timeout=WAIT)
    assert connection.seen == [State.CONNECTING, State.ENDED] and not connection.poller.running
    assert connection.reason == f"there is no QueueProcessor farm in {url} yet: start a node there"

    Farm(url).close()  # now there is one
    connection.seen.clear()
    connection.open(url)
    qtbot.waitUntil(lambda: connection.state is State.CONNECTED, timeout=WAIT)
    assert connection.seen == [State.CONNECTING, State.CONNECTED] and connection.node_id is None


@pytest.mark.postgres
def test_a_database_that_cannot_be_reached_fails_in_one_line_then_a_retry_connects(pg_url, link, qtbot):
    from sqlalchemy.engine import make_url

    from tests.support.tcpproxy import TcpProxy

    target = make_url(pg_url)
    Farm(pg_url).close()
    with TcpProxy(target.host, target.port) as proxy:
        proxy.cut()  # the server refuses every connection
        url = target.set(port=proxy.port).render_as_string(hide_password=False)
        connection = link()
        connection.open(url)
        qtbot.waitUntil(lambda: connection.state is State.FAILED, timeout=WAIT)
        reason = connection.reason
        assert reason.startswith("cannot reach the database: ") and reason.endswith("; retrying")
        assert "\n" not in reason and target.password not in reason and f":{proxy.port}/" in reason
        assert connection.live  # the worker tries again by itself...

        proxy.restore()  # ...and its next try connects
        qtbot.waitUntil(lambda: connection.state is State.CONNECTED, timeout=WAIT)
        assert connection.seen[0] is State.CONNECTING and set(connection.seen[1:-1]) == {State.FAILED}
        assert connection.seen[-1] is State.CONNECTED

        proxy.cut()  # connected, then lost: a different state, and the worker goes on
        qtbot.waitUntil(lambda: connection.state is State.LOST, timeout=WAIT)
        assert "retrying" in connection.reason and target.password not in connection.reason
        proxy.restore()
        qtbot.waitUntil(lambda: connection.state is State.CONNECTED, timeout=WAIT)


def test_a_bug_in_a_read_is_broken_not_lost_and_the_next_good_read_connects_again(tmp_path, link, qtbot):
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    Farm(url).close()
    connection = link()
    connection.open(url)
    qtbot.waitUntil(lambda: connection.state is State.CONNECTED, timeout=WAIT)
    connection.set_query(history="a week")  # a bug's stand-in: the read raises TypeError
    qtbot.waitUntil(lambda: connection.state is State.BROKEN, timeout=WAIT)
    assert connection.reason.startswith("Reading the farm failed: TypeError: ")
    connection.set_query(history=600.0)
    qtbot.waitUntil(lambda: connection.state is State.CONNECTED, timeout=WAIT)
    assert connection.seen == [State.CONNECTING, State.CONNECTED, State.BROKEN, State.CONNECTED]


def test_the_commands_are_farm_calls_with_the_message_the_status_bar_shows(tmp_path, qtbot):
    with Farm(f"sqlite:///{tmp_path / 'farm.db'}") as farm:
        said = []
        commands = Commands(lambda label, call: said.append((label, call(farm))))

        commands.enqueue(work_spec("http", "/later"), delay=3600)
        [(label, message)] = said
        [job] = farm.list_jobs()
        unserved = "; no live machine serves queue default yet: it waits"  # no node in this farm
        assert (label, message) == ("Enqueue", f"enqueued job {job['id']}{unserved}")
        assert job["state"] == JobState.QUEUED
        commands.enqueue(work_spec("http", "/bulk"), delay=3600, count=3)
        ids = sorted(j["id"] for j in farm.list_jobs() if j["target"] == "/bulk")
        assert said[-1] == ("Enqueue", f"enqueued 3 jobs ({ids[0]}..{ids[-1]}){unserved}")

        commands.cancel(job["id"])
        assert said[-1] == (f"Cancel job {job['id']}", "cancelled")
        assert farm.job(job["id"])["state"] == JobState.CANCELLED
        commands.retry(job["id"])
        assert said[-1] == (f"Retry job {job['id']}", "queued again")
        assert farm.job(job["id"])["state"] == JobState.QUEUED

        farm.schedule("tick", work_spec("http", "/tick"), every=3600)  # no node: no occurrence made yet
        commands.pause_schedule("tick")
        assert said[-1] == ("Pause schedule tick", "paused (0 waiting occurrences cancelled)")
        assert farm.get_schedule("tick")["paused"]
        commands.resume_schedule("tick")
        assert said[-1][0] == "Resume schedule tick" and said[-1][1].startswith("active, next at ")
        assert not farm.get_schedule("tick")["paused"]
        commands.remove_schedule("tick")
        assert said[-1] == ("Remove schedule tick", "removed (0 waiting occurrences cancelled)")
        assert farm.list_schedules() == []

        farm.singleton("feed", work_spec("http", "/feed"))
        commands.remove_singleton("feed")
        assert said[-1] == ("Remove singleton feed", "cancelled")
        assert [s["state"] for s in farm.list_singletons()] == [JobState.CANCELLED]

        node = farm.node(name="peer", capacity=1).start()
        try:
            commands.steer(node.id, "peer", Wish.PAUSE)
            assert said[-1] == ("Pause peer", "asked peer to pause; it applies this within one heartbeat")
            qtbot.waitUntil(lambda: node.state == MachineState.PAUSED, timeout=WAIT)
        finally:
            node.stop(drain=False)
