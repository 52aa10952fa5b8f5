"""The desktop app against a real farm: real nodes, a real database (SQLite and PostgreSQL), real Qt widgets
offscreen. What the window draws must be what the database holds, and what an operator does in it must
change the farm."""

import json
import os
import re
import threading
from dataclasses import replace

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QPoint, QSettings, Qt, QThreadPool, QTimer  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QApplication, QLabel, QMenu, QMessageBox  # noqa: E402

from queueprocessor.farm import Farm, without_password  # noqa: E402
from queueprocessor.nodeoptions import NodeConfig  # noqa: E402
from queueprocessor.rules.clock import SystemClock  # noqa: E402
from queueprocessor.store.database import mask  # noqa: E402
from queueprocessor.store.types import ClaimRequest
from tests.support import pyjobs  # noqa: E402
from ui.app import make_app, node_options, parse_args  # noqa: E402
from ui.connection import State  # noqa: E402
from ui.dialogs import DatabaseDialog, EnqueueDialog  # noqa: E402
from ui.mainwindow import MainWindow  # noqa: E402
from ui.models import ROW_ROLE  # noqa: E402
from ui.operator import recent_databases  # noqa: E402

FAST = dict(period=0.25, heartbeat=0.25, misses=4)
WAIT = 30_000  # ms: generous, so a loaded CI machine is slow rather than failing


@pytest.fixture
def app(qapp, tmp_path):
    """The app as `main()` sets it up, with its settings in a private folder."""
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "settings"))
    return make_app([], "light")


@pytest.fixture
def open_window(app, qtbot):
    """Opens main windows; closes them at the end the way a user does, and checks nothing was left running."""
    windows = []

    def open_(url, node=None):
        window = MainWindow(url, node, interval=0.1)
        window.show()
        windows.append(window)
        return window

    yield open_
    for window in windows:
        close(window, qtbot)


def close(window, qtbot):
    window.close()
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=WAIT)
    assert not window.connection.poller.running
    leftover = [t.name for t in threading.enumerate() if t.name.startswith("qp-") and t.is_alive()]
    active = [t for t in window.findChildren(QTimer) if t.isActive() and t.parent() is window]
    assert active == [], f"timers still running after close: {active}"
    return leftover


@pytest.fixture
def peers(farm, http_target):
    """Start nodes of the farm in this process (real Node objects: heartbeats, turns, a job runner)."""
    started = []

    def start(name, skew=0.0):
        node = farm.node(name=name, http_base=http_target.base_url, clock=SystemClock(skew)).start()
        started.append(node)
        return node

    yield start
    for node in started:
        node.stop(drain=False)


def _node(http_target, name="gui", skew=0.4):
    return NodeConfig(name=name, capacity=2, http_base=http_target.base_url, clock_skew=skew)


def test_the_window_draws_what_the_database_holds(farm, peers, http_target, open_window, qtbot):
    farm.settings(**FAST)
    peers("peer-1", -0.6)
    peers("peer-2", 0.3)
    farm.enqueue_http("/ok", count=6)
    farm.enqueue_http("/fail", max_attempts=1, count=2)
    window = open_window(farm.url, _node(http_target))

    def settled():
        snap = window.snap
        return (
            snap is not None
            and snap.job_counts["queued"] == snap.job_counts["running"] == 0
            and snap.job_counts["failed"] == 2
            and len({t["machine_id"] for t in snap.turns}) == 3
        )

    qtbot.waitUntil(settled, timeout=WAIT)
    snap, store = window.snap, farm._store

    # Slots timeline: the solid bars are the turn log (slots that ended before the read, so no turn is in flight).
    last = int((snap.until - 2 * snap.period) / snap.period)
    logged = [(t["slot"], t["machine_id"]) for t in store.views.turns_between(snap.since, snap.until)]
    assert [p for p in window.timeline.plotted_turns() if p[0] <= last] == [p for p in logged if p[0] <= last]
    assert len({machine for _, machine in logged}) == 3  # all three machines took turns
    slot, machine = logged[0]
    hover = window.timeline.describe(slot * snap.period + 0.01, machine)
    assert f"Slot {slot}" in hover and snap.names[machine] in hover and "claimed" in hover

    # Runs Gantt: one bar per run, in its machine's lane, coloured by its outcome. A run closes in its own
    # statement, so a snapshot may show one still running that the database, read later, has closed: wait for a
    # snapshot taken after the last run closed, then the plot must equal the run log over its window.
    def plotted_runs_are_the_run_log():
        nonlocal snap, runs
        snap = window.snap
        runs = store.views.runs_between(snap.since, snap.until)
        return sorted(r["outcome"] for r in runs) == ["failed"] * 2 + [
            "succeeded"
        ] * 6 and window.jobs.gantt.plotted_runs() == sorted(
            (r["machine_id"], r["started_at"], r["outcome"]) for r in runs
        )

    runs = None
    qtbot.waitUntil(plotted_runs_are_the_run_log, timeout=WAIT)
    run = runs[0]
    assert f"Job {run['job_id']}" in window.jobs.gantt.describe(run["started_at"] + 0.001, run["machine_id"])

    # Peers: every machine, with its judged state; exactly one leader among them.
    status = farm.status()
    shown = [window.peers.index(row, 0).data(ROW_ROLE) for row in range(window.peers.rowCount())]
    assert [(m["id"], m["name"], m["host"]) for m in shown] == [
        (m["id"], m["name"], m["host"]) for m in status["machines"]
    ]
    assert [window.peers.index(row, 2).data() for row in range(len(shown))] == ["active"] * 3
    assert sum(window.peers.index(row, 3).data() == "★ now" for row in range(len(shown))) == 1

    # Jobs table and queue graph.
    listed = [window.jobs.model.index(row, 0).data(ROW_ROLE) for row in range(window.jobs.model.rowCount())]
    assert [(j["id"], j["state"]) for j in listed] == [(j["id"], j["state"]) for j in store.jobs.newest(limit=500)]
    window.tabs.setCurrentWidget(window.queue)  # the queue graph draws while it is on screen
    assert window.queue.plotted_throughput() == dict(succeeded=6, failed=2, timeout=0, lost=0, cancelled=0, snoozed=0)
    assert window.queue.counts["succeeded"].text() == "6"

    # This node's panel shows the in-process node, with the counts the peers table shows in the same frame.
    assert window.node_panel.name.text().startswith("gui")
    assert window.node_panel.badge.text() == "active"
    row = next(r for r in range(window.peers.rowCount()) if window.peers.index(r, 0).data() == "gui")
    done, failed = (window.peers.index(row, _column(window.peers, title)).data() for title in ("Done", "Failed"))
    assert window.node_panel.fields["done"].text() == f"{int(done):,} · {int(failed):,}"


def _column(model, title: str) -> int:
    return next(n for n, column in enumerate(model.columns) if column.title == title)


def _listed(window):
    model = window.jobs.model
    return [model.index(row, 0).data(ROW_ROLE)["id"] for row in range(model.rowCount())]


def test_filters_ask_the_database_beyond_the_newest_jobs_shown(farm, open_window, qtbot):
    [weekly] = farm.enqueue_http("/reports/weekly", delay=3600)
    [daily] = farm.enqueue_http("/reports/daily", delay=3600)
    farm._store.jobs.cancel(daily)
    bulk = farm.enqueue_http("/bulk", delay=3600, count=520)  # the table lists the newest 500 only
    window = open_window(farm.url)
    window.tabs.setCurrentWidget(window.jobs)
    qtbot.waitUntil(lambda: _listed(window) == bulk[::-1][:500], timeout=WAIT)

    window.jobs.search.setText("WEEKLY")  # case does not matter; the job is older than any listed
    qtbot.waitUntil(lambda: _listed(window) == [weekly], timeout=WAIT)
    window.jobs.search.setText("reports/")
    qtbot.waitUntil(lambda: _listed(window) == [daily, weekly], timeout=WAIT)
    window.jobs.state.setCurrentIndex(window.jobs.state.findData("cancelled"))  # both filters at once
    qtbot.waitUntil(lambda: _listed(window) == [daily], timeout=WAIT)
    window.jobs.search.setText("")
    qtbot.waitUntil(lambda: _listed(window) == [daily], timeout=WAIT)
    window.jobs.state.setCurrentIndex(window.jobs.state.findData(None))
    qtbot.waitUntil(lambda: _listed(window) == bulk[::-1][:500], timeout=WAIT)


def _steer_from_menu(window, name, wish):
    """Right-click the machine's row in the peers table and pick the wish."""
    row = next(r for r in range(window.peers.rowCount()) if window.peers.index(r, 0).data() == name)
    window.operator.show_peer_menu(window.peers_view.visualRect(window.peers.index(row, 0)).center())
    [action] = [a for a in window.operator.peer_menu.actions() if a.text() == f"{wish.capitalize()} {name}"]
    assert action.isEnabled()
    action.trigger()
    window.operator.peer_menu.close()


def _answer_drain(window, qtbot, button):
    """Drain asks first (a drained node stops for good): answer the question."""
    qtbot.waitUntil(
        lambda: window.operator.drain_confirm is not None and window.operator.drain_confirm.isVisible(), timeout=WAIT
    )
    box, window.operator.drain_confirm = window.operator.drain_confirm, None
    box.button(button).click()


def _own_node(window):
    """The node the app runs in-process, on its worker."""
    return window.connection.poller.node


def _status(window, name):
    return next((m["status"] for m in window.snap.machines if m["name"] == name), None) if window.snap else None


def test_pause_resume_and_drain_from_the_app_steer_the_node(farm, peers, http_target, open_window, qtbot):
    farm.settings(**FAST)
    peer = peers("peer")
    window = open_window(farm.url, _node(http_target))
    qtbot.waitUntil(lambda: _status(window, "peer") == "active" and window.snap.node is not None, timeout=WAIT)

    _steer_from_menu(window, "peer", "pause")
    qtbot.waitUntil(lambda: peer.state == "paused" and _status(window, "peer") == "paused", timeout=WAIT)
    paused_at = farm._store.ask_time()
    qtbot.wait(1500)  # six slots
    assert [t for t in farm._store.turns.read(paused_at) if t["machine_id"] == peer.id] == []

    _steer_from_menu(window, "peer", "resume")
    qtbot.waitUntil(lambda: peer.state == "active", timeout=WAIT)
    resumed_at = farm._store.ask_time()
    qtbot.waitUntil(lambda: any(t["machine_id"] == peer.id for t in farm._store.turns.read(resumed_at)), timeout=WAIT)

    _steer_from_menu(window, "peer", "drain")
    _answer_drain(window, qtbot, QMessageBox.StandardButton.Cancel)  # changed its mind: nothing happens
    qtbot.wait(1000)
    assert peer.state == "active" and farm._store.machines.find(str(peer.id))["wish"] is None
    _steer_from_menu(window, "peer", "drain")
    _answer_drain(window, qtbot, QMessageBox.StandardButton.Yes)
    qtbot.waitUntil(lambda: peer.stopped.is_set() and _status(window, "peer") == "stopped", timeout=WAIT)

    # This machine's own node, through the Node menu's actions (the panel's buttons and shortcuts). Their
    # labels and tips say "this machine": the Schedules tab has Pause and Resume buttons of its own.
    for action in (window.act.pause, window.act.resume, window.act.drain, window.act.start):
        assert "This Machine" in action.text() and "this machine" in action.toolTip(), action.text()
    assert window.act.pause.shortcut().toString() == "Ctrl+Shift+P"
    qtbot.waitUntil(window.act.pause.isEnabled, timeout=WAIT)
    window.act.pause.trigger()
    qtbot.waitUntil(
        lambda: _own_node(window).state == "paused" and window.node_panel.badge.text() == "paused", timeout=WAIT
    )
    assert window.act.resume.isEnabled() and not window.act.pause.isEnabled()
    window.act.resume.trigger()
    qtbot.waitUntil(lambda: _own_node(window).state == "active", timeout=WAIT)
    assert not window.act.start.isEnabled()
    window.act.drain.trigger()
    _answer_drain(window, qtbot, QMessageBox.StandardButton.Yes)
    qtbot.waitUntil(lambda: _own_node(window).stopped.is_set(), timeout=WAIT)
    drained = window.connection.node_id

    # Drained, this machine's node starts again without restarting the app: it rejoins as a new machine row.
    qtbot.waitUntil(window.act.start.isEnabled, timeout=WAIT)
    window.act.start.trigger()
    qtbot.waitUntil(
        lambda: (
            window.connection.node_id != drained
            and window.node_panel.badge.text() == "active"
            and any(m["id"] == window.connection.node_id and m["status"] == "active" for m in window.snap.machines)
        ),
        timeout=WAIT,
    )
    assert farm._store.machines.find(str(drained))["state"] == "stopped"
    assert farm._store.machines.find(str(window.connection.node_id))["state"] == "active"
    assert not window.act.start.isEnabled() and window.act.pause.isEnabled()


def _enqueue(window, qtbot, path, **fields):
    window.operator.enqueue()
    dialog = window.findChildren(EnqueueDialog)[-1]
    dialog.path.setText(path)
    for name, value in fields.items():
        getattr(dialog, name).setValue(value)
    dialog.accept()
    qtbot.waitUntil(lambda: window.last_result is not None and window.last_result[0] == "Enqueue", timeout=WAIT)
    label, ok, message = window.last_result
    window.last_result = None
    assert ok, message
    return int(re.search(r"job (\d+)", message).group(1))


def _select(window, qtbot, job_id, state):
    window.tabs.setCurrentWidget(window.jobs)
    qtbot.waitUntil(
        lambda: window.jobs.select(job_id) and (window.jobs.selected_job() or {}).get("state") == state, timeout=WAIT
    )


def test_enqueue_retry_and_cancel_work_end_to_end(farm, http_target, open_window, qtbot):
    farm.settings(**FAST)
    window = open_window(farm.url, _node(http_target))

    ok = _enqueue(window, qtbot, "/ok")
    qtbot.waitUntil(lambda: farm._store.jobs.get(ok)["state"] == "succeeded", timeout=WAIT)
    assert [r["job"] for r in http_target.requests("/ok")] == [ok]

    failing = _enqueue(window, qtbot, "/fail", attempts=1)
    qtbot.waitUntil(lambda: farm._store.jobs.get(failing)["state"] == "failed", timeout=WAIT)
    _select(window, qtbot, failing, "failed")
    qtbot.waitUntil(
        lambda: (
            window.jobs.details.title.text().startswith(f"Job {failing} ")
            and window.jobs.details.attempts.rowCount() == 1
        ),
        timeout=WAIT,
    )
    qtbot.waitUntil(window.act.retry.isEnabled, timeout=WAIT)
    window.act.retry.trigger()
    qtbot.waitUntil(
        lambda: len(farm._store.runs.read(job_id=failing)) == 2 and farm._store.jobs.get(failing)["state"] == "failed",
        timeout=WAIT,
    )
    assert len(http_target.requests("/fail")) == 2
    qtbot.waitUntil(lambda: window.jobs.details.attempts.rowCount() == 2, timeout=WAIT)
    attempt = window.jobs.details.attempts
    assert [attempt.index(r, 2).data() for r in range(2)] == ["1", "2"]  # a new fence for each claim

    later = _enqueue(window, qtbot, "/ok", delay=600)
    _select(window, qtbot, later, "queued")
    qtbot.waitUntil(window.act.cancel.isEnabled, timeout=WAIT)
    window.act.cancel.trigger()
    qtbot.waitUntil(
        lambda: (
            farm._store.jobs.get(later)["state"] == "cancelled"
            and window.last_result == (f"Cancel job {later}", True, "cancelled")
        ),
        timeout=WAIT,
    )


def test_the_apps_node_runs_the_work_its_allow_lists_allow(farm, open_window, qtbot):
    farm.settings(**FAST)
    args = parse_args(
        [
            "--name",
            "desk",
            "--allow-module",
            pyjobs.__name__,
            "--allow-command",
            "true",
            "--allow-host",
            "reports.internal",
        ]
    )
    window = open_window(farm.url, node_options(args))
    qtbot.waitUntil(lambda: window.snap is not None and window.snap.node is not None, timeout=WAIT)
    [machine] = farm.status()["machines"]
    assert json.loads(machine["allow"]) == {
        "hosts": ["reports.internal"],
        "modules": [pyjobs.__name__],
        "commands": ["true"],
    }
    # Enqueueing checks the live machines' allow-lists: without the app's node nobody would take these.
    python_job = pyjobs.echo.enqueue(farm, {"day": "monday"})
    [command_job] = farm.enqueue_command(["true"])
    qtbot.waitUntil(
        lambda: [farm.job(j)["state"] for j in (python_job, command_job)] == ["succeeded"] * 2, timeout=WAIT
    )
    assert {run["machine_id"] for j in (python_job, command_job) for run in farm.job(j)["runs"]} == {machine["id"]}


def test_closing_leaves_no_thread_or_timer_and_stops_the_node(farm, http_target, app, qtbot):
    before = set(threading.enumerate())
    window = MainWindow(farm.url, _node(http_target), interval=0.1)
    window.show()
    qtbot.waitUntil(lambda: window.snap is not None and window.snap.node is not None, timeout=WAIT)
    node_id = window.connection.node_id
    close(window, qtbot)
    leaked = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    assert leaked == []
    assert QThreadPool.globalInstance().activeThreadCount() == 0
    assert not window.ticker.isActive()
    assert farm._store.machines.find(str(node_id))["state"] == "stopped"
    settings = QSettings()
    assert settings.value("window/geometry") is not None
    assert recent_databases(settings) == [without_password(farm.url)]  # never its password


@pytest.mark.postgres
def test_a_lost_database_shows_as_a_state_and_the_window_stays_live(pg_url, app, qtbot):
    from sqlalchemy.engine import make_url

    from tests.support.tcpproxy import TcpProxy

    target = make_url(pg_url)
    Farm(pg_url).close()  # a farm to watch: watching creates nothing
    with TcpProxy(target.host, target.port) as proxy:
        url = target.set(port=proxy.port).render_as_string(hide_password=False)
        window = MainWindow(url, None, interval=0.1)
        window.show()
        try:
            qtbot.waitUntil(
                lambda: window.snap is not None and window.connection.state is State.CONNECTED, timeout=WAIT
            )
            proxy.freeze()  # the database stops answering: the read on the worker hangs
            qtbot.waitUntil(lambda: window.connection.state is State.SLOW, timeout=WAIT)
            assert "no answer" in window.status.link.text()
            proxy.cut()  # now it refuses outright
            qtbot.waitUntil(lambda: window.connection.state is State.LOST, timeout=WAIT)
            assert window.banner.isVisible() and "Showing the farm as of" in window.banner.text()
            assert target.password not in window.status.link.text() + window.windowTitle()
            proxy.restore()
            qtbot.waitUntil(
                lambda: window.connection.state is State.CONNECTED and not window.banner.isVisible(), timeout=WAIT
            )
        finally:
            close(window, qtbot)


def test_the_status_bar_link_says_the_latest_read_and_is_set_only_when_that_changes(
    farm, open_window, qtbot, monkeypatch
):
    window = open_window(farm.url)
    qtbot.waitUntil(lambda: window.snap is not None and window.connection.state is State.CONNECTED, timeout=WAIT)
    link = window.status.link
    assert f"connected · read {window.snap.read_ms:.0f} ms" in link.text()
    set_to = []
    monkeypatch.setattr(link, "setText", lambda text: set_to.append(text) or QLabel.setText(link, text))
    shown = link.text()
    for _ in range(20):  # the window's 100 ms ticks (run here without letting a new snapshot in)
        window._tick()
    assert set_to == [] and link.text() == shown
    window.show_snapshot(replace(window.snap, read_ms=window.snap.read_ms + 1234))  # a slower read: said at once
    assert len(set_to) == 1 and f"read {window.snap.read_ms:.0f} ms" in link.text()


def test_open_database_switches_farms_and_moves_this_machines_node(tmp_path, http_target, open_window, qtbot):
    first, second = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    window = open_window(first, _node(http_target, name="desk"))
    qtbot.waitUntil(lambda: window.snap is not None and window.snap.node is not None, timeout=WAIT)
    window.operator.switch_database(second)
    qtbot.waitUntil(
        lambda: (
            window.connection.url == second
            and window.snap is not None
            and window.snap.node is not None
            and [m["name"] for m in window.snap.machines] == ["desk"]
        ),
        timeout=WAIT,
    )
    assert window.windowTitle().endswith(second)
    with Farm(first) as old:
        assert [m["state"] for m in old.status()["machines"]] == ["stopped"]  # it left the first farm


def test_a_bug_in_an_action_or_a_poll_is_reported_and_the_node_goes_on(farm, http_target, open_window, qtbot):
    window = open_window(farm.url, _node(http_target))
    qtbot.waitUntil(lambda: window.snap is not None and window.snap.node is not None, timeout=WAIT)

    window.connection.act("Oops", lambda farm: {}["missing"])  # an action with a bug in it
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=WAIT)
    assert window.last_result == ("Oops", False, "KeyError: 'missing'")
    assert window.banner.isVisible() and "Oops failed: KeyError" in window.banner.text()
    assert window.connection.poller.running and _own_node(window).state == "active"
    assert _enqueue(window, qtbot, "/ok")  # the next action still runs

    window.connection.set_query(history="a week")  # a bug's stand-in: the read raises TypeError, not a database error
    qtbot.waitUntil(lambda: "Reading the farm failed: TypeError" in window.banner.text(), timeout=WAIT)
    qtbot.waitUntil(lambda: window.connection.state is State.BROKEN, timeout=WAIT)  # not slow: it says what fails
    assert "Reading the farm failed" in window.status.link.text()
    window.connection.set_query(history=600.0)
    qtbot.waitUntil(lambda: window.connection.state is State.CONNECTED, timeout=WAIT)
    assert window.connection.poller.running
    assert farm._store.machines.find(str(window.connection.node_id))["state"] == "active"


def test_a_worker_that_ends_unexpectedly_leaves_a_lasting_banner(farm, open_window, qtbot):
    # A setting of the wrong type makes starting the node raise TypeError: a bug, not an outage.
    window = open_window(farm.url, NodeConfig(name="desk", capacity="one"))
    qtbot.waitUntil(lambda: not window.connection.poller.running and window.banner.isVisible(), timeout=WAIT)
    assert "background worker stopped" in window.banner.text().lower()
    assert "TypeError" in window.banner.text() and "Open Database" in window.banner.text()
    qtbot.wait(int(window.banner.timer.interval() * 1.2))  # lasting: no timer hides it
    assert window.banner.isVisible() and window.connection.state is State.ENDED
    assert "background worker stopped" in window.status.link.text()


def test_one_views_failure_leaves_the_others_drawing(farm, http_target, open_window, qtbot, monkeypatch, caplog):
    farm.settings(**FAST)
    window = open_window(farm.url, _node(http_target))
    qtbot.waitUntil(lambda: window.snap is not None and window.snap.node is not None, timeout=WAIT)

    def broken(snap):
        raise ValueError("cannot draw this")

    monkeypatch.setattr(window.jobs, "show_snapshot", broken)  # e.g. a payload the jobs view cannot parse
    farm.enqueue_http("/ok", delay=3600, count=3)
    qtbot.waitUntil(lambda: window.snap.job_counts["queued"] == 3, timeout=WAIT)
    shown = window.snap
    qtbot.waitUntil(lambda: window.snap is not shown, timeout=WAIT)  # and one more, to see it logged only once
    assert window.queue.drawing.latest is window.snap  # the queue graph, schedules, peers and node panel still draw
    assert window.schedules.schedules_model.context["db_now"] == window.snap.db_now
    assert window.peers.rowCount() == 1 and window.node_panel.badge.text() == "active"
    assert window.banner.isVisible() and "job runs" in window.banner.text() and "ValueError" in window.banner.text()
    [logged] = [r for r in caplog.records if r.name == "ui.mainwindow"]  # once, not every poll
    assert logged.message.startswith("the job runs could not show the snapshot of ") and logged.exc_info
    monkeypatch.undo()
    qtbot.waitUntil(lambda: window.jobs.model.rowCount() == 3 and not window.broken, timeout=WAIT)


def test_end_follows_now_in_the_plots_and_goes_to_the_last_row_in_a_table(farm, open_window, qtbot):
    farm.enqueue_http("/later", delay=3600, count=40)
    window = open_window(farm.url)
    window.activateWindow()
    window.tabs.setCurrentWidget(window.jobs)
    qtbot.waitUntil(lambda: window.jobs.model.rowCount() == 40, timeout=WAIT)
    window.timeline.set_follow(False)
    jobs = window.jobs.table
    jobs.setFocus()
    jobs.setCurrentIndex(window.jobs.model.index(0, 0))
    QTest.keyClick(jobs, Qt.Key.Key_End)
    assert jobs.currentIndex().row() == 39 and not window.timeline.follow
    QTest.keyClick(jobs, Qt.Key.Key_Home)
    assert jobs.currentIndex().row() == 0

    plot = window.timeline.plot
    plot.setFocus()
    QTest.keyClick(plot, Qt.Key.Key_End)
    assert window.timeline.follow and window.act.follow.isChecked()
    QTest.keyClick(plot, Qt.Key.Key_End)  # not a toggle: pressed while following, it keeps following
    assert window.timeline.follow and window.act.follow.isChecked()
    window.act.follow.trigger()
    assert window.timeline.follow and window.act.follow.isChecked()


def test_the_tab_columns_and_sort_order_outlive_the_window(farm, open_window, qtbot):
    window = open_window(farm.url)
    window.tabs.setCurrentWidget(window.schedules)
    window.jobs.table.sortByColumn(2, Qt.SortOrder.AscendingOrder)
    window.peers_view.setColumnWidth(0, 211)
    close(window, qtbot)

    again = open_window(farm.url)
    assert again.tabs.currentWidget() is again.schedules
    header = again.jobs.table.horizontalHeader()
    assert (header.sortIndicatorSection(), header.sortIndicatorOrder()) == (2, Qt.SortOrder.AscendingOrder)
    assert again.peers_view.columnWidth(0) == 211
    close(again, qtbot)

    QSettings().setValue("titles/peers", ["Machine", "Capacity"])  # as if an app with other columns saved it
    other = open_window(farm.url)
    assert other.peers_view.columnWidth(0) == 120  # that layout is not laid over these columns


def test_the_window_reads_whole_on_a_desktop_and_a_laptop_screen(farm, peers, http_target, open_window, qtbot):
    """1440x900: the peers and schedules tables show their columns without scrolling sideways, and the peers table
    cuts no value; the least needed columns are hidden, a right-click on the header away, a choice that outlives
    the window. 1024x640: the jobs filter's text box goes under the lists rather than shrink beside them to "Fi…"."""
    farm.settings(**FAST)
    peers("web-01", -0.6)
    window = open_window(farm.url, _node(http_target))
    window.resize(1440, 900)
    qtbot.waitUntil(lambda: window.snap is not None and window.peers.rowCount() == 2, timeout=WAIT)
    view, header = window.peers_view, window.peers_view.horizontalHeader()
    assert "Host" not in _columns(view) and "Round trip" not in _columns(view)
    qtbot.waitUntil(lambda: view.horizontalScrollBar().maximum() == 0, timeout=WAIT)
    window.tabs.setCurrentWidget(window.schedules)  # the schedules table too, with Misfire hidden
    assert "Misfire" not in _columns(window.schedules.schedules_view)
    qtbot.waitUntil(lambda: window.schedules.schedules_view.horizontalScrollBar().maximum() == 0, timeout=WAIT)
    window.tabs.setCurrentWidget(window.peers_view)
    for row in range(window.peers.rowCount()):
        for column in map(header.logicalIndex, range(header.count())):
            index = window.peers.index(row, column)
            icon = 20 if index.data(Qt.ItemDataRole.DecorationRole) is not None else 0
            assert view.fontMetrics().horizontalAdvance(index.data()) + icon + 8 <= header.sectionSize(
                column
            ) or header.isSectionHidden(column), (index.data(), header.sectionSize(column))

    header.customContextMenuRequested.emit(QPoint(5, 5))
    menu = view.findChild(QMenu, "columnsMenu")
    checks = {action.text(): action for action in menu.actions()}
    assert list(checks) == _columns(view, hidden=True)
    assert not checks["Machine"].isEnabled()  # it names the row
    assert [name for name, action in checks.items() if not action.isChecked()] == ["Host", "Round trip"]
    checks["Host"].trigger()
    assert "Host" in _columns(view)
    close(window, qtbot)

    again = open_window(farm.url)
    assert "Host" in _columns(again.peers_view) and "Round trip" not in _columns(again.peers_view)
    again.tabs.setCurrentWidget(again.jobs)
    jobs = again.jobs
    hint = jobs.search.fontMetrics().horizontalAdvance("Filter by text: id, target")
    for size, under in (((1024, 640), True), ((1440, 900), False)):
        again.resize(*size)
        qtbot.waitUntil(lambda: jobs.filters.beside is not under, timeout=WAIT)
        QApplication.processEvents()
        assert (jobs.search.y() > jobs.queue.y()) is under and jobs.search.width() >= hint


def test_the_jobs_table_shows_its_columns_without_scrolling_sideways_at_1440(farm, open_window, qtbot):
    """1440x900, a full table: the job, its state, queue, target, error and machine are all in view, the error
    taking the room the others leave; the attempts and times, which the selected job's details show, are hidden,
    a right-click on the header away."""
    farm.enqueue_http("/api/partners/sync?account=7&full=1", delay=3600, count=40)
    window = open_window(farm.url)
    window.resize(1440, 900)
    window.tabs.setCurrentWidget(window.jobs)
    view = window.jobs.table
    qtbot.waitUntil(lambda: view.model().rowCount() == 40 and view.verticalScrollBar().isVisible(), timeout=WAIT)
    qtbot.waitUntil(lambda: view.horizontalScrollBar().maximum() == 0, timeout=WAIT)
    assert not view.horizontalScrollBar().isVisible()
    assert _columns(view) == ["Job", "State", "Queue", "Target", "Error", "Machine"]
    assert _columns(view, hidden=True)[6:] == ["Attempts", "Created", "Finished", "Progress"]
    assert view.horizontalHeader().sectionSize(7) >= 120, "the error has room to be read"


def test_the_attempts_table_shows_its_columns_without_scrolling_sideways_at_1440(farm, open_window, qtbot):
    """1440x900, a job tried twice, the first with a long error: the attempt, machine, outcome and error are in
    view, the error cut short with the whole of it in the tooltip; the fence and times are a right-click away, a
    choice that outlives the window."""
    machine = farm._store.machines.register(name="web-01", host="host", instance="i-1", pid=1, version="t", capacity=1)
    (job_id,) = farm.enqueue_http("/flaky")
    error = "GET http://127.0.0.1:8080/flaky: HTTP 503 Service Unavailable: " + "upstream timed out; " * 8
    (claimed,) = farm._store.jobs.claim(ClaimRequest(machine, 1, 60))
    farm._store.runs.finish(claimed, machine, "failed", error=error, retry_in=0)
    (claimed,) = farm._store.jobs.claim(ClaimRequest(machine, 1, 60))
    farm._store.runs.finish(claimed, machine, "succeeded")
    window = open_window(farm.url)
    window.resize(1440, 900)
    window.tabs.setCurrentWidget(window.jobs)
    qtbot.waitUntil(lambda: window.jobs.select(job_id), timeout=WAIT)
    view = window.jobs.details.attempts_view
    qtbot.waitUntil(lambda: view.model().rowCount() == 2, timeout=WAIT)
    qtbot.waitUntil(lambda: view.horizontalScrollBar().maximum() == 0, timeout=WAIT)
    assert not view.horizontalScrollBar().isVisible()
    shown = _columns(view)
    assert shown == ["Attempt", "Machine", "Outcome", "Error"]
    assert [title for title in _columns(view, hidden=True) if title not in shown] == [
        "Fence",
        "Took",
        "Started",
        "Finished",
        "Progress",
    ]
    cell = view.model().index(0, 7)
    assert view.visualRect(cell).right() <= view.viewport().width() and view.columnWidth(7) >= 120
    assert view.fontMetrics().horizontalAdvance(cell.data()) > view.columnWidth(7), "the error is cut short"
    assert cell.data(Qt.ItemDataRole.ToolTipRole) == error
    view.horizontalHeader().showSection(2)  # as the header's menu does: a choice that outlives the window
    close(window, qtbot)
    assert "Fence" in _columns(open_window(farm.url).jobs.details.attempts_view)


def _columns(view, hidden=False) -> list[str]:
    """A table's column titles in the order shown (those hidden too, if asked)."""
    header = view.horizontalHeader()
    return [
        view.model().headerData(logical, Qt.Orientation.Horizontal)
        for logical in map(header.logicalIndex, range(header.count()))
        if hidden or not header.isSectionHidden(logical)
    ]


@pytest.mark.postgres
def test_open_recent_asks_for_the_password_and_a_refused_login_asks_again(pg_url, tmp_path, open_window, qtbot):
    from sqlalchemy.engine import make_url

    Farm(pg_url).close()
    password = make_url(pg_url).password
    recent = without_password(pg_url)  # as the recent list keeps it
    here = f"sqlite:///{tmp_path / 'here.db'}"
    Farm(here).close()
    window = open_window(here)
    qtbot.waitUntil(lambda: window.snap is not None, timeout=WAIT)

    def asked():
        dialogs = [d for d in window.findChildren(DatabaseDialog) if d.isVisible()]
        return dialogs[-1] if dialogs else None

    window.operator.open_recent(recent)
    qtbot.waitUntil(lambda: asked() is not None, timeout=WAIT)
    dialog = asked()
    assert dialog.choice.currentText() == recent and "password" in dialog.error.text()
    dialog.password.setText("not-" + password)
    dialog.accept()
    # The server turns the login down: said once, clearly, and asked again; not retried as an outage.
    qtbot.waitUntil(lambda: not window.connection.poller.running and asked() is not None, timeout=WAIT)
    assert window.connection.state is State.REFUSED and "password authentication failed" in window.banner.text()
    dialog = asked()
    assert "refused the login" in dialog.error.text() and dialog.choice.currentText() == recent
    assert password not in window.banner.text() + window.status.link.text() + dialog.error.text()
    dialog.password.setText(password)
    dialog.accept()
    qtbot.waitUntil(lambda: window.connection.state is State.CONNECTED and window.snap is not None, timeout=WAIT)
    assert window.status.database.text() == mask(pg_url) and not window.banner.isVisible()
    assert recent_databases(QSettings())[0] == recent
