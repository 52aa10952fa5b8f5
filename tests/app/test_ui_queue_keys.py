"""Flow control per fairness key in the app, against a real farm (SQLite and PostgreSQL) and real Qt widgets
offscreen: the Queues tab's "Per key" column, the busiest keys of the selected queue beside the charts (read on the
worker thread, again while it stays selected on screen, none read while the tab is hidden) and the queue dialog's
fair share, limit and rate per key and where keyless jobs take their key, reaching the database."""

import json
import os
from dataclasses import replace

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402

from queueprocessor.nodeoptions import NodeConfig  # noqa: E402
from queueprocessor.rules.fairness import KeyUse  # noqa: E402
from queueprocessor.rules.queues import OnFailure, QueueInfo, Rate  # noqa: E402
from queueprocessor.store.types import ClaimRequest, Plan  # noqa: E402
from tests.app import test_ui_window  # noqa: E402
from tests.app.test_ui_queues import LATER, _cells, _edit, _queue, _tab  # noqa: E402
from ui.commands import Commands  # noqa: E402
from ui.models import TOOLTIP  # noqa: E402
from ui.queuekeys import TOKENS, KeysPanel  # noqa: E402
from ui.queuesview import KEYS_EVERY  # noqa: E402

app, open_window = test_ui_window.app, test_ui_window.open_window  # the window tests' fixtures
WAIT = test_ui_window.WAIT
PER_KEY = 8  # the Queues table's "Per key" column


def _machine(farm, queues: str) -> int:
    """A machine serving `queues` by name (they exist from then on), which never checks in."""
    return farm._store.machines.register(
        name="m", host="h", instance="m-1", pid=1, version="t", capacity=64, queues=queues
    )


def _claim(farm, me: int, queue: str, most: int) -> None:
    """Start what the queue's claim allows, as a node serving it would (its limit and rate per key kept)."""
    plan = Plan(alone=((queue, most, True),), keyed=(queue,))
    farm._store.jobs.claim(ClaimRequest(me, most, 30.0, plan=plan))


def _keys(view) -> list[tuple[str, ...]]:
    """The busiest keys panel's rows as shown (of the Queues tab or the panel itself): key, running, waiting (and
    tokens when that column shows)."""
    panel = view if isinstance(view, KeysPanel) else view.keys
    model, shown = panel.model, not panel.table.isColumnHidden(TOKENS)
    columns = range(model.columnCount() if shown else TOKENS)
    return [tuple(model.index(row, column).data() for column in columns) for row in range(model.rowCount())]


def _select(view, name: str) -> None:
    view.table.selectRow(view.model.row_of(name))


def test_the_tab_shows_flow_per_key_and_the_busiest_keys_of_the_selected_queue(farm, open_window, qtbot, tmp_path):
    me = _machine(farm, "tenants,capped,rated")
    farm.set_queue("tenants", fair=True, key_limit=3, key_rate="600/min", fair_from="payload.tenant")
    farm.set_queue("capped", key_limit=2)
    farm.set_queue("rated", key_rate="5/s")
    farm.enqueue_http("/t", queue="tenants", fair_key="big", count=6)
    farm.enqueue_http("/t", queue="tenants", fair_key="small", cost=2, count=2)
    farm.enqueue_http("/t", queue="tenants", payload=json.dumps({"tenant": "acme"}))  # its key from its payload
    _claim(farm, me, "tenants", 20)  # big fills its limit of 3, small runs one job of cost 2, acme its one job
    farm.enqueue_http("/t", queue="tenants", fair_key="globex", count=12)
    farm.enqueue_http("/t", queue="tenants", fair_key="initech", count=4)
    farm.enqueue_http("/plain", delay=LATER, queue="plain", count=2)
    window = open_window(farm.url)  # --observe
    view = _tab(window)
    qtbot.waitUntil(lambda: {"tenants", "capped", "rated", "plain"} <= set(view.queues), timeout=WAIT)

    # The column says each queue's flow control per key; its cell's tooltip where keyless jobs take their key.
    assert view.model.headerData(PER_KEY, Qt.Orientation.Horizontal) == "Per key"
    assert "≤N" in view.model.headerData(PER_KEY, Qt.Orientation.Horizontal, TOOLTIP)
    assert {name: _cells(view.model, name)[PER_KEY] for name in ("tenants", "capped", "rated", "plain")} == {
        "tenants": f"fair · ≤3 · {Rate(600, 60.0)}",
        "capped": "≤2 per key",
        "rated": "5/s per key",
        "plain": "-",
    }
    tenants = view.model.index(view.model.row_of("tenants"), PER_KEY)
    assert tenants.data(TOOLTIP).startswith("Fair share: its claims take the keys in turn, by weight; at most 3 ")
    assert tenants.data(TOOLTIP).endswith("; jobs enqueued without a fairness key take their payload's field “tenant”")
    capped = view.model.index(view.model.row_of("capped"), PER_KEY).data(TOOLTIP)
    assert capped == "At most 2 units of one key running at once"

    # Selected, a keyed queue's busiest keys show beside the charts, out of its limit per key, with their tokens.
    assert not view.keys.isVisible()
    _select(view, "tenants")
    busiest = [("big", "3/3", "3"), ("small", "2/3", "1"), ("acme", "1/3", "0"), ("globex", "0/3", "12")]
    qtbot.waitUntil(lambda: [row[:3] for row in _keys(view)] == [*busiest, ("initech", "0/3", "4")], timeout=WAIT)
    assert view.keys.isVisible() and view.keys.title.text() == "Busiest keys of tenants"
    # Their buckets of 10 refill at 10/s: what one read finds depends on when it reads, but each is a bucket's.
    assert all(0 <= float(row[TOKENS]) <= 10 for row in _keys(view))
    window.grab().save(str(tmp_path / "queues-keys.png"))  # at the app's default size
    if shots := os.environ.get("QP_SCREENSHOTS"):
        window.grab().save(os.path.join(shots, "queues-keys.png"))

    # While it stays selected on screen, the keys are read again: new work shows without touching the table.
    farm.enqueue_http("/t", queue="tenants", fair_key="small", count=4)
    qtbot.waitUntil(lambda: ("small", "2/3", "5") in [row[:3] for row in _keys(view)], timeout=WAIT)

    # A queue with a limit per key only: its keys without tokens; one with no keyed job says so.
    _select(view, "capped")
    qtbot.waitUntil(lambda: view.keys.hint.isVisible(), timeout=WAIT)
    assert view.keys.table.isColumnHidden(TOKENS) and not view.keys.table.isVisible()
    assert view.keys.hint.text() == "No job of capped has a fairness key running or waiting"

    # A plain queue has no panel.
    _select(view, "plain")
    assert not view.keys.isVisible()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # when the app reads is its own, whatever the backend
def test_the_keys_are_read_only_while_the_tab_is_on_screen_and_a_keyed_queue_selected(farm, open_window, qtbot):
    farm.enqueue_http("/t", delay=LATER, queue="tenants", fair_key="a")
    farm.set_queue("tenants", fair=True)
    window = open_window(farm.url)
    view = _tab(window)
    qtbot.waitUntil(lambda: "tenants" in view.queues, timeout=WAIT)
    asked = []
    read = view.commands.read_queue_keys
    view.commands.read_queue_keys = lambda name, then: (asked.append(name), read(name, then))
    _select(view, "tenants")
    assert asked == ["tenants"], "read at once when selected"
    qtbot.waitUntil(lambda: _keys(view) == [("a", "0", "1")], timeout=WAIT)
    # Again while it stays selected, every KEYS_EVERY seconds of the snapshots' database time, not each snapshot.
    span = _snapshots_seen(window, qtbot, 3 * KEYS_EVERY)
    assert 3 <= len(asked) <= 2 + span / KEYS_EVERY, (len(asked), span)

    window.tabs.setCurrentWidget(window.peers_view)
    before = len(asked)
    _snapshots_seen(window, qtbot, 2 * KEYS_EVERY)
    assert len(asked) == before, "no read while the tab is hidden"

    _tab(window)
    qtbot.waitUntil(lambda: len(asked) > before, timeout=WAIT)
    farm.set_queue("tenants", fair=False)  # no flow per key any more: the panel goes, and no more reads
    qtbot.waitUntil(lambda: not view.keys.isVisible(), timeout=WAIT)
    before = len(asked)
    _snapshots_seen(window, qtbot, 2 * KEYS_EVERY)
    assert len(asked) == before


def _snapshots_seen(window, qtbot, span: float) -> float:
    """Wait for snapshots spanning more than `span` seconds of database time (a snapshot every 0.1 s); that span."""
    seen: list[float] = []

    def newer() -> bool:
        if window.snap is not None and (not seen or window.snap.db_now > seen[-1]):
            seen.append(window.snap.db_now)
        return len(seen) > 1 and seen[-1] - seen[0] > span

    qtbot.waitUntil(newer, timeout=WAIT)
    return seen[-1] - seen[0]


def test_the_queue_dialog_sets_fair_share_and_the_limit_and_rate_per_key(farm, open_window, qtbot):
    farm.enqueue_http("/t", delay=LATER, queue="tenants")
    farm.set_queue("tenants", limit=5)
    window = open_window(farm.url, NodeConfig(name="desk", capacity=1, queues="default"))
    view = _tab(window)
    qtbot.waitUntil(lambda: "tenants" in view.queues, timeout=WAIT)

    # Bad input: one line naming the field as the form labels it; the dialog stays open and changes nothing.
    dialog = _edit(view, "tenants")
    assert (dialog.fair.isChecked(), dialog.key_limit.text(), dialog.key_rate.text()) == (False, "", "")
    assert dialog.fair_from.currentText() == ""
    for field, bad, word in (
        (dialog.key_limit, "0", "Limit per key"),
        (dialog.key_limit, "three", "Limit per key"),
        (dialog.key_rate, "5/fortnight", "Rate per key"),
        (dialog.fair_from.lineEdit(), "payload.", "Keys from"),
        (dialog.fair_from.lineEdit(), "tenant", "Keys from"),
    ):
        field.setText(bad)
        dialog.accept()
        assert dialog.isVisible() and word in dialog.error.text() and "\n" not in dialog.error.text()
        field.setText("")
    assert not _queue(farm, "tenants").fair

    # Only what changed is sent: the farm-wide limit another operator sets meanwhile stays as they set it.
    dialog.fair.setChecked(True)
    dialog.key_limit.setText("3")
    dialog.key_rate.setText("5/s")
    dialog.fair_from.setCurrentText("payload.tenant")
    farm.set_queue("tenants", limit=7)
    window.last_result = None
    dialog.accept()
    assert dialog.changes == dict(fair=True, key_limit=3, key_rate=Rate(5, 1.0), fair_from="payload.tenant")
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=WAIT)
    assert window.last_result == (
        "Set queue tenants",
        True,
        "fair on, key limit 3, key rate 5/s, fair from payload.tenant",
    )
    stored = _queue(farm, "tenants")
    assert (stored.fair, stored.key_limit, stored.key_rate, stored.fair_from, stored.limit) == (
        True,
        3,
        Rate(5, 1.0),
        "payload.tenant",
        7,
    )
    qtbot.waitUntil(lambda: _cells(view.model, "tenants")[PER_KEY] == "fair · ≤3 · 5/s", timeout=WAIT)

    # Emptied and unchecked, they are removed.
    dialog = _edit(view, "tenants")
    assert (dialog.fair.isChecked(), dialog.key_limit.text(), dialog.key_rate.text()) == (True, "3", "5/s")
    assert dialog.fair_from.currentText() == "payload.tenant"
    dialog.fair.setChecked(False)
    dialog.key_limit.setText("")
    dialog.key_rate.setText("")
    dialog.fair_from.setCurrentText("")
    dialog.accept()
    assert dialog.changes == dict(fair=False, key_limit=None, key_rate=None, fair_from=None)
    qtbot.waitUntil(lambda: _cells(view.model, "tenants")[PER_KEY] == "-", timeout=WAIT)
    stored = _queue(farm, "tenants")
    assert (stored.fair, stored.key_limit, stored.key_rate, stored.fair_from) == (False, None, None, None)


def test_the_panel_shows_each_keys_use_as_the_farm_gave_it(qapp):
    panel = KeysPanel()
    info = QueueInfo("t", 0, 0, None, None, 0, False, OnFailure.SKIP, (), fair=True, key_rate=Rate(5, 1.0))
    panel.follow(info)
    panel.show_keys("other", [KeyUse("x", 1, 1, 1.0)])  # a read asked before the panel moved on: not shown
    assert _keys(panel) == []
    panel.show_keys("t", [KeyUse("acme", 2, 1_200, 3.25), KeyUse("debtor", 1, 0, -12.0)])
    assert _keys(panel) == [("acme", "2", "1,200", "3.2"), ("debtor", "1", "0", "-12.0")]
    assert panel.caption.text() == "fair · 5/s"
    panel.follow(replace(info, key_limit=3, key_rate=None, fair_from="order_key"))  # its settings changed
    assert _keys(panel) == [("acme", "2/3", "1,200"), ("debtor", "1/3", "0")]
    assert panel.caption.text() == "fair · ≤3; keyless jobs take their order key"


def test_the_keys_command_reads_the_farms_busiest_keys(farm):
    farm.enqueue_http("/t", delay=LATER, queue="tenants", fair_key="a", count=2)
    got = []
    Commands(lambda label, call: None, lambda label, read, then: then(read(farm))).read_queue_keys(
        "tenants", got.append
    )
    assert [(k.key, k.running, k.waiting) for [k] in got] == [("a", 0, 2)]
