"""The app opened by an operator whose database user may only read (a real PostgreSQL role with GRANT SELECT):
the whole farm is shown, every action that would change it is disabled with a tooltip saying why, and no node
is started here, since it could not register."""

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from queueprocessor.nodeoptions import NodeConfig  # noqa: E402
from tests.acceptance.test_bad_input import snapshot  # noqa: E402
from tests.acceptance.test_read_only_operators import READER_GRANTS, refusal, role_url  # noqa: E402
from tests.acceptance.test_security import prepare_farm  # noqa: E402
from tests.app.test_ui_window import WAIT, app, open_window  # noqa: E402, F401  (fixtures)

pytestmark = pytest.mark.postgres


def test_a_reader_sees_the_farm_with_every_action_disabled_and_told_why(pg_url, open_window, qtbot):  # noqa: F811
    prepare_farm(pg_url)
    url = role_url(pg_url, READER_GRANTS)
    before = snapshot(pg_url)
    window = open_window(url, NodeConfig(name="reader-desk", capacity=1))
    qtbot.waitUntil(lambda: window.snap is not None and bool(window.snap.machines), timeout=WAIT)
    why = refusal(url)
    assert window.connection.read_only == why and window.connection.node_id is None
    assert [m["name"] for m in window.snap.machines] == ["desk"]  # the farm, and no node of this app in it
    assert why in window.node_panel.note.text()

    window.tabs.setCurrentWidget(window.jobs)
    qtbot.waitUntil(lambda: window.jobs.table.model().rowCount() == 2, timeout=WAIT)
    for row in range(2):  # a failed job (retry) and a queued one (cancel)
        window.jobs.table.selectRow(row)
        window._update_actions()
        writers = [*window.act.writers, *window.schedules.writers]
        assert [a.objectName() or a.text() for a in writers if a.isEnabled()] == []
        assert {a.toolTip() for a in writers} == {f"Read-only: {why}"}
    assert window.act.refresh.isEnabled() and window.act.open.isEnabled()  # looking still works

    window.operator.show_peer_menu(window.peers_view.visualRect(window.peers.index(0, 0)).center())
    menu = window.operator.peer_menu
    assert [a.text() for a in menu.actions() if a.isEnabled()] == []
    assert {a.toolTip() for a in menu.actions()} == {f"Read-only: {why}"}
    menu.close()

    window.tabs.setCurrentWidget(window.queues)
    qtbot.waitUntil(lambda: window.queues.model.rowCount() > 0, timeout=WAIT)
    window.queues.show_menu("default", window.queues.mapToGlobal(window.queues.rect().center()))
    menu = window.queues.menu
    assert [a.text() for a in menu.actions() if a.isEnabled()] == []
    assert {a.toolTip() for a in menu.actions()} == {f"Read-only: {why}"}
    menu.close()
    assert snapshot(pg_url) == before
