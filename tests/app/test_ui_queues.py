"""The app's side of named queues against a real farm (SQLite and PostgreSQL), real nodes and real Qt widgets
offscreen: the Queues tab shows the queues the database holds and its right-click menu changes them; the job
runs filter by queue; the enqueue dialog's queue and order key reach the job row; the peers table and this
machine's panel show the queues each machine serves."""

import os
import re

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QPoint  # noqa: E402

from queueprocessor import work_spec  # noqa: E402
from queueprocessor.farm import Farm  # noqa: E402
from queueprocessor.nodeoptions import NodeConfig  # noqa: E402
from queueprocessor.rules.breaker import Seen  # noqa: E402
from queueprocessor.rules.queues import OnFailure, Rate  # noqa: E402
from tests.app import test_ui_window  # noqa: E402
from tests.support.work import FAST, Nodes  # noqa: E402
from ui import theme  # noqa: E402
from ui.app import node_options, parse_args  # noqa: E402
from ui.commands import Commands  # noqa: E402
from ui.dialogs import EnqueueDialog, QueueDialog  # noqa: E402
from ui.models import BACKGROUND, ROW_ROLE, TOOLTIP  # noqa: E402

app, open_window = test_ui_window.app, test_ui_window.open_window  # the window tests' fixtures
WAIT = test_ui_window.WAIT
LATER = 3600  # s: a delay that keeps a job waiting for the whole test


def _tab(window):
    window.tabs.setCurrentWidget(window.queues)
    return window.queues


def _rows(model) -> list[dict]:
    return [model.index(row, 0).data(ROW_ROLE) for row in range(model.rowCount())]


def _cells(model, name) -> list[str]:
    row = model.row_of(name)
    return [model.index(row, column).data() for column in range(model.columnCount())]


def _shown(view) -> dict:
    return {name: view.queues[name] for name in (row["name"] for row in _rows(view.model))}


def _menu(view, name):
    """Right-click the queue's row; the menu's actions by their text."""
    model = view.model
    view._table_menu(view.table.visualRect(model.index(model.row_of(name), 0)).center())
    return {action.text(): action for action in view.menu.actions()}


def test_the_tab_shows_the_queues_of_a_real_farm(farm, open_window, qtbot):
    farm.settings(**FAST)
    nodes = Nodes(farm)
    try:
        nodes("reporter", queues="reports,default")
        farm.enqueue_http("/reports/daily", delay=LATER, queue="reports", count=3)
        farm.set_queue("reports", limit=2, rate="10/s", on_failure=OnFailure.BLOCK)
        farm.enqueue_http("/render", delay=LATER, queue="gpu", count=2, order_key="scene-1")
        window = open_window(farm.url)  # --observe: only the reporter serves queues
        view = _tab(window)
        qtbot.waitUntil(
            lambda: (
                set(_shown(view)) >= {"reports", "gpu"} and _shown(view) == {info.name: info for info in farm.queues()}
            ),
            timeout=WAIT,
        )

        name, state, waiting, running, limit, rate, rate_now, breaker, per_key, keys, on_failure, serving = _cells(
            view.model, "reports"
        )
        assert (rate_now, breaker, per_key) == ("10/s", "none", "-")
        assert (state, waiting, running, limit, rate, keys, on_failure, serving) == (
            "active",
            "3",
            "0",
            "2",
            str(Rate(10, 1.0)),
            "0",
            "block",
            "reporter",
        )
        assert _cells(view.model, "gpu")[1:3] + _cells(view.model, "gpu")[9:] == [
            "unserved",
            "2",
            "1",
            _queue(farm, "gpu").on_failure,
            "none",
        ]
        # The unserved queue stands out, and says why its jobs wait.
        gpu = view.model.row_of("gpu")
        assert view.model.index(gpu, 0).data(BACKGROUND).name() == theme.current().dead_bg
        assert "No live machine serves gpu" in view.model.index(gpu, 0).data(TOOLTIP)

        # Each queue's chart draws its waiting and running counts over time, the latest as the table shows them.
        qtbot.waitUntil(lambda: len(view.charts.charts["reports"].plotted()) >= 2, timeout=WAIT)
        assert sorted(view.charts.charts) == sorted(info.name for info in farm.queues())
        assert view.charts.charts["reports"].plotted()[-1][1:] == (3, 0)
        assert view.charts.charts["gpu"].plotted()[-1][1:] == (2, 0)
        assert view.charts.charts["reports"].cap.isVisible() and view.charts.charts["reports"].cap.value() == 2
        assert not view.charts.charts["gpu"].cap.isVisible()
        # Over time: more work for gpu shows as a step up, the earlier samples kept.
        farm.enqueue_http("/render", delay=LATER, queue="gpu", count=2)
        gpu_chart = view.charts.charts["gpu"]
        qtbot.waitUntil(lambda: gpu_chart.plotted()[-1][1] == 4, timeout=WAIT)
        times, waiting = zip(*((t, w) for t, w, _ in gpu_chart.plotted()))
        assert list(times) == sorted(times) and waiting[0] == 2 and set(waiting) == {2, 4}
    finally:
        nodes.stop_all()


def test_pause_resume_and_limits_from_the_menu_reach_the_database(farm, open_window, qtbot):
    farm.settings(**FAST)
    farm.enqueue_http("/reports/daily", delay=LATER, queue="reports")
    window = open_window(farm.url, NodeConfig(name="desk", capacity=1))
    view = _tab(window)
    qtbot.waitUntil(lambda: "reports" in _shown(view), timeout=WAIT)

    actions = _menu(view, "reports")
    assert [(text, action.isEnabled()) for text, action in actions.items()] == [
        ("Pause queue reports", True),
        ("Resume queue reports", False),
        ("Limit and rate of reports…", True),
        ("Reset the breaker of reports", False),
    ]
    view.menu.close()
    view.menu = None
    view.charts.charts["reports"].plot.customContextMenuRequested.emit(QPoint(5, 5))  # its chart has it too
    assert [action.text() for action in view.menu.actions()] == list(actions)
    view.menu.close()
    actions["Pause queue reports"].trigger()
    qtbot.waitUntil(
        lambda: _queue(farm, "reports").paused and _cells(view.model, "reports")[1] == "paused", timeout=WAIT
    )
    assert window.last_result[:2] == ("Pause queue reports", True)

    actions = _menu(view, "reports")
    assert not actions["Pause queue reports"].isEnabled()
    actions["Resume queue reports"].trigger()
    view.menu.close()
    qtbot.waitUntil(
        lambda: not _queue(farm, "reports").paused and _cells(view.model, "reports")[1] == "active", timeout=WAIT
    )

    # Limit and rate: bad input is one line in the dialog, which stays open and changes nothing.
    dialog = _edit(view, "reports")
    for limit, rate, word in (
        ("0", "", "Limit"),
        ("two", "", "Limit"),
        ("", "ten/s", "Rate"),
        ("", "5/fortnight", "Rate"),
        ("", "", "Keep"),
    ):
        dialog.limit.setText(limit)
        dialog.rate.setText(rate)
        dialog.keep.setText("3x" if word == "Keep" else "")
        dialog.accept()
        assert dialog.isVisible() and word in dialog.error.text() and "\n" not in dialog.error.text()
    assert (_queue(farm, "reports").limit, _queue(farm, "reports").rate) == (None, None)
    dialog.limit.setText("3")
    dialog.rate.setText("5/min")
    assert dialog.on_failure.currentData() == _queue(farm, "reports").on_failure == OnFailure.SKIP  # the default
    dialog.on_failure.setCurrentIndex(dialog.on_failure.findData(OnFailure.BLOCK))
    dialog.keep.setText("3d")
    dialog.accept()
    assert not dialog.isVisible()
    qtbot.waitUntil(lambda: _cells(view.model, "reports")[4:6] == ["3", str(Rate(5, 60.0))], timeout=WAIT)
    stored = _queue(farm, "reports")
    assert (stored.limit, stored.rate, stored.on_failure, stored.keep) == (3, Rate(5, 60.0), OnFailure.BLOCK, 3 * 86400)

    # Emptied fields lift the limit and the rate, and give the queue the farm's retention back.
    dialog = _edit(view, "reports")
    assert (dialog.limit.text(), dialog.rate.text(), dialog.keep.text()) == ("3", str(Rate(5, 60.0)), "3d")
    dialog.limit.setText("")
    dialog.rate.setText("")
    dialog.keep.setText("")
    dialog.accept()
    qtbot.waitUntil(lambda: _cells(view.model, "reports")[4:6] == ["none", "none"], timeout=WAIT)
    stored = _queue(farm, "reports")
    assert (stored.limit, stored.rate, stored.keep) == (None, None, None)


def _queue(farm, name):
    return next(info for info in farm.queues() if info.name == name)


def _edit(view, name) -> QueueDialog:
    _menu(view, name)[f"Limit and rate of {name}…"].trigger()
    view.menu.close()
    assert view.dialog.isVisible()
    return view.dialog


def test_watch_only_the_menu_changes_nothing(farm, open_window, qtbot):
    farm.enqueue_http("/reports/daily", delay=LATER, queue="reports")
    window = open_window(farm.url)  # --observe
    view = _tab(window)
    qtbot.waitUntil(lambda: "reports" in _shown(view), timeout=WAIT)
    assert not any(action.isEnabled() for action in _menu(view, "reports").values())
    view.menu.close()


def test_the_job_runs_filter_by_queue(farm, open_window, qtbot):
    reports = farm.enqueue_http("/reports/daily", delay=LATER, queue="reports", count=3)
    gpu = farm.enqueue_http("/render", delay=LATER, queue="gpu", count=2)
    plain = farm.enqueue_http("/ok", delay=LATER, count=2)
    farm.cancel(reports[0])
    window = open_window(farm.url)
    window.tabs.setCurrentWidget(window.jobs)
    everything = sorted(reports + gpu + plain, reverse=True)
    qtbot.waitUntil(lambda: test_ui_window._listed(window) == everything, timeout=WAIT)
    jobs = window.jobs
    qtbot.waitUntil(
        lambda: (
            [jobs.queue.itemText(n) for n in range(jobs.queue.count())] == ["All queues", "default", "gpu", "reports"]
        ),
        timeout=WAIT,
    )

    jobs.queue.setCurrentIndex(jobs.queue.findData("reports"))
    qtbot.waitUntil(lambda: test_ui_window._listed(window) == reports[::-1], timeout=WAIT)
    assert {row["queue"] for row in _rows(window.jobs.model)} == {"reports"}
    jobs.state.setCurrentIndex(jobs.state.findData("cancelled"))  # with the state filter too
    qtbot.waitUntil(lambda: test_ui_window._listed(window) == [reports[0]], timeout=WAIT)
    jobs.search.setText("render")  # and the text search: nothing of reports matches
    qtbot.waitUntil(lambda: test_ui_window._listed(window) == [], timeout=WAIT)
    jobs.search.setText("")
    jobs.state.setCurrentIndex(jobs.state.findData(None))
    jobs.queue.setCurrentIndex(jobs.queue.findData("gpu"))
    qtbot.waitUntil(lambda: test_ui_window._listed(window) == gpu[::-1], timeout=WAIT)
    jobs.queue.setCurrentIndex(jobs.queue.findData(None))
    qtbot.waitUntil(lambda: test_ui_window._listed(window) == everything, timeout=WAIT)


def test_the_enqueue_dialog_reaches_the_job_row_and_says_when_no_live_machine_serves_its_queue(
    farm, http_target, open_window, qtbot
):
    farm.settings(**FAST)
    window = open_window(farm.url, test_ui_window._node(http_target).given(queues="reports"))
    farm.enqueue_http("/ok", delay=LATER, queue="reports")
    qtbot.waitUntil(
        lambda: (
            window.snap is not None
            and window.snap.own_row is not None
            and "reports" in [q.name for q in window.snap.queues]
        ),
        timeout=WAIT,
    )

    # The queue field offers the farm's queues; a new name may be typed (it makes a new queue).
    dialog = _enqueue_dialog(window)
    assert [dialog.queue.itemText(n) for n in range(dialog.queue.count())] == ["default", "reports"]
    assert dialog.queue.currentText() == "default"
    dialog.queue.setCurrentText("reports")
    dialog.order_key.setText("invoice-7")
    dialog.delay.setValue(LATER)
    job = _enqueued(farm, window, dialog, qtbot)
    assert (job["queue"], job["order_key"]) == ("reports", "invoice-7")
    # This machine serves reports: the status bar says the job was enqueued, and no more.
    assert window.statusBar().currentMessage() == f"Enqueue: enqueued job {job['id']}"

    # No live machine serves default here: the job is accepted, and the status bar says it waits.
    dialog = _enqueue_dialog(window)
    dialog.delay.setValue(LATER)
    waiting = _enqueued(farm, window, dialog, qtbot)
    assert waiting["queue"] == "default" and waiting["state"] == "queued"
    assert window.statusBar().currentMessage() == (
        f"Enqueue: enqueued job {waiting['id']}; no live machine serves queue default yet: it waits"
    )

    # The job's details say its queue and order key.
    test_ui_window._select(window, qtbot, job["id"], "queued")
    qtbot.waitUntil(lambda: window.jobs.details.fields["queue"].text() == "reports · invoice-7", timeout=WAIT)

    # A bad queue name or order key: one line in the dialog, which stays open; nothing is enqueued.
    before = len(farm._store.jobs.newest())
    for queue, order_key, word in (("no spaces", "", "Queue"), ("reports", "k" * 300, "Order key")):
        dialog = _enqueue_dialog(window)
        dialog.queue.setCurrentText(queue)
        dialog.order_key.setText(order_key)
        dialog.accept()
        assert dialog.isVisible() and word in dialog.error.text() and "\n" not in dialog.error.text()
        dialog.reject()
    assert len(farm._store.jobs.newest()) == before


def _enqueue_dialog(window) -> EnqueueDialog:
    window.operator.enqueue()
    return window.findChildren(EnqueueDialog)[-1]


def _enqueued(farm, window, dialog, qtbot) -> dict:
    """Press Enqueue in the dialog; the job row it made, once the window has the command's answer."""
    window.last_result = None
    dialog.accept()
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=WAIT)
    label, ok, message = window.last_result
    assert label == "Enqueue" and ok, message
    return farm._store.jobs.get(int(re.search(r"job (\d+)", message).group(1)))


def test_peers_queues_and_this_machine_show_the_queues_each_serves_with_its_own_limits(farm, open_window, qtbot):
    farm.settings(**FAST)
    nodes = Nodes(farm)
    try:
        nodes("everything")
        nodes("reporter", queues="reports:2")
        args = parse_args(["--name", "desk", "--queues", "reports,default:3"])
        window = open_window(farm.url, node_options(args))
        qtbot.waitUntil(
            lambda: window.snap is not None and len(window.snap.machines) == 3 and window.snap.own_row is not None,
            timeout=WAIT,
        )
        peers = window.peers
        column = next(n for n, c in enumerate(peers.columns) if c.title == "Queues")
        shown = {peers.index(row, 0).data(): peers.index(row, column).data() for row in range(peers.rowCount())}
        assert shown == {"everything": "every queue", "reporter": "reports ≤2", "desk": "reports, default ≤3"}
        assert window.node_panel.fields["queues"].text() == "reports, default ≤3"
        # The Queues tab names the live machines serving each queue, each with its own limit for that queue. It
        # is waited for, not read once: at this test's timing a machine silent for 0.6 s is dead, and on a loaded
        # machine the farm judges one dead now and then, and the tab rightly drops it until it checks in again.
        view = _tab(window)
        qtbot.waitUntil(
            lambda: (
                {"reports", "default"} <= set(_shown(view))
                and (_cells(view.model, "reports")[-1], _cells(view.model, "default")[-1])
                == ("everything, reporter ≤2, desk", "everything, desk ≤3")
            ),
            timeout=WAIT,
        )
    finally:
        nodes.stop_all()


def test_the_queue_commands_are_farm_calls_with_the_message_the_status_bar_shows(tmp_path):
    with Farm(f"sqlite:///{tmp_path / 'farm.db'}") as farm:
        said = []
        commands = Commands(lambda label, call: said.append((label, call(farm))))
        # Work for a queue no live machine serves is accepted, and the message says it waits.
        commands.enqueue(work_spec("http", "/later", queue="reports"), delay=LATER)
        [job] = farm.list_jobs()
        assert said[-1] == ("Enqueue", f"enqueued job {job['id']}; no live machine serves queue reports yet: it waits")
        assert job["queue"] == "reports"
        commands.pause_queue("reports")
        assert said[-1][0] == "Pause queue reports" and said[-1][1].startswith("paused")
        assert _queue(farm, "reports").paused
        commands.resume_queue("reports")
        assert said[-1][0] == "Resume queue reports" and not _queue(farm, "reports").paused
        commands.set_queue("reports", dict(limit=4, rate=Rate(2, 60.0)))
        assert said[-1] == ("Set queue reports", "limit 4, rate 2/min")
        commands.set_queue("reports", dict(limit=None))
        assert said[-1] == ("Set queue reports", "limit none")
        stored = _queue(farm, "reports")
        assert (stored.limit, stored.rate) == (None, Rate(2, 60.0))


def test_the_apps_queues_option_is_refused_in_one_line_as_the_nodes(capsys):
    for bad in ("re ports", ",", "reports:0"):
        with pytest.raises(SystemExit) as refused:
            parse_args(["--queues", bad])
        err = capsys.readouterr().err
        assert refused.value.code == 2 and err.startswith("error: --queues ") and err.count("\n") == 1, err


def test_the_tab_draws_a_breaker_and_the_rate_its_claims_allow_and_resets_it(farm, open_window, qtbot, tmp_path):
    farm.enqueue_http("/api", delay=LATER, queue="api", count=2)
    farm.set_queue("api", rate="10/s", breaker="3/60s", adaptive="1/s")
    farm._store.breakers.note({"api": Seen(throttled=2)}, 1.0)  # the rate halved, two failures counted
    window = open_window(farm.url, NodeConfig(name="desk", capacity=1, queues="default"))
    view = _tab(window)
    qtbot.waitUntil(lambda: view.model.row_of("api") is not None, timeout=WAIT)
    qtbot.waitUntil(lambda: _cells(view.model, "api")[5:8] == ["10/s", "5/s ↓", "closed · 2/3 in 60s"], timeout=WAIT)
    farm._store.breakers.note({"api": Seen(failed=1)}, 1.0)  # the third failure opens it
    qtbot.waitUntil(lambda: _cells(view.model, "api")[7] == "open", timeout=WAIT)
    row = view.model.row_of("api")
    assert view.model.index(row, 0).data(BACKGROUND).name() == theme.current().dead_bg
    assert "breaker is open" in view.model.index(row, 0).data(TOOLTIP)
    view.resize(1400, 500)
    view.grab().save(str(tmp_path / "queues-breaker.png"))
    if shots := os.environ.get("QP_SCREENSHOTS"):
        view.grab().save(os.path.join(shots, "queues-breaker.png"))

    # The turn timeline marks the breaker's changes with the other events, along its top edge.
    window.tabs.setCurrentWidget(window.event_log)
    opened = [e["at"] for e in farm.events(kind="queue") if e["kind"] in ("queue.breaker_opened", "queue.rate_adapted")]
    qtbot.waitUntil(lambda: {at for at, _y in window.timeline.plotted_events()} >= set(opened), timeout=WAIT)

    _menu(view, "api")["Reset the breaker of api"].trigger()
    qtbot.waitUntil(lambda: _cells(view.model, "api")[6:8] == ["10/s", "closed · 0/3 in 60s"], timeout=WAIT)
