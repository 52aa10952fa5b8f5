"""The app's side of dependencies, workflows and groups against a real farm (SQLite and PostgreSQL) and real Qt
widgets offscreen: a job's details list its parents and children and a click goes there; a workflow or group
opens as a graph of its steps in their states' colours, redrawn as the states change; a waiting job says what it
waits for."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QPoint, Qt  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402

from tests.app import test_ui_window  # noqa: E402
from ui import theme  # noqa: E402
from ui.models import TOOLTIP  # noqa: E402

app, open_window = test_ui_window.app, test_ui_window.open_window  # the window tests' fixtures
WAIT = test_ui_window.WAIT


def diamond(farm) -> tuple[int, dict[str, int]]:
    """fetch, then left and right, then join after both: its id, and its jobs by step. No node runs them."""
    flow = farm.workflow("diamond")
    flow.step("fetch", farm.http_spec("/ok"))
    flow.step("left", farm.http_spec("/ok"), after=["fetch"])
    flow.step("right", farm.http_spec("/ok"), after=["fetch"])
    flow.step("join", farm.http_spec("/ok"), after=["left", "right"])
    flow_id = flow.enqueue()
    return flow_id, {s["name"]: s["job_id"] for s in farm.workflow_info(flow_id)["steps"]}


def _details_of(window, qtbot, job_id):
    qtbot.waitUntil(lambda: window.jobs.details.title.text() == f"Job {job_id} and its attempts", timeout=WAIT)
    return window.jobs.details.links


def test_details_list_parents_and_children_and_a_click_goes_there(farm, open_window, qtbot):
    flow_id, ids = diamond(farm)
    window = open_window(farm.url)  # only watching: nothing runs, so every state holds still
    window.tabs.setCurrentWidget(window.jobs)
    qtbot.waitUntil(lambda: window.jobs.select(ids["left"]), timeout=WAIT)

    links = _details_of(window, qtbot, ids["left"])
    qtbot.waitUntil(lambda: links.links("after") == [f"job:{ids['fetch']}"], timeout=WAIT)
    assert links.links("children") == [f"job:{ids['join']}"]
    assert links.links("flows") == [f"flow:{flow_id}"]
    assert "step left" in links.fields["flows"].text()

    field = links.fields["after"]  # its first link is its first word: a click at its start follows it
    QTest.mouseClick(field, Qt.MouseButton.LeftButton, pos=field.rect().topLeft() + QPoint(3, field.height() // 2))
    links = _details_of(window, qtbot, ids["fetch"])
    assert window.jobs.selected_job()["id"] == ids["fetch"]
    qtbot.waitUntil(
        lambda: links.links("children") == [f"job:{ids['left']}", f"job:{ids['right']}"] and not links.links("after"),
        timeout=WAIT,
    )
    assert not links.fields["after"].isVisible()  # a job without parents has no such line

    # A job the table does not list (filtered out) is shown all the same.
    window.jobs.state.setCurrentIndex(window.jobs.state.findData("queued"))
    qtbot.waitUntil(lambda: [r["id"] for r in window.snap.jobs] == [ids["fetch"]], timeout=WAIT)
    window.jobs.details.links.fields["children"].linkActivated.emit(f"job:{ids['right']}")
    links = _details_of(window, qtbot, ids["right"])
    qtbot.waitUntil(lambda: links.links("children") == [f"job:{ids['join']}"], timeout=WAIT)


def test_a_waiting_job_says_what_it_waits_for(farm, open_window, qtbot):
    _, ids = diamond(farm)
    window = open_window(farm.url)
    model = window.jobs.model
    qtbot.waitUntil(lambda: model.row_of(ids["join"]) is not None, timeout=WAIT)
    state = model.index(model.row_of(ids["join"]), 1)
    assert state.data() == "waiting"
    assert state.data(TOOLTIP) == f"waits for {ids['left']}, {ids['right']}"
    assert model.index(model.row_of(ids["fetch"]), 1).data(TOOLTIP) is None  # queued: it waits for nothing

    window.jobs.select(ids["join"])
    links = _details_of(window, qtbot, ids["join"])
    qtbot.waitUntil(lambda: links.links("waits") == [f"job:{ids['left']}", f"job:{ids['right']}"], timeout=WAIT)

    farm.cancel(ids["left"])  # the join is cancelled with it: it waits no more
    qtbot.waitUntil(
        lambda: model.row_of(ids["join"]) is not None and "waits_for" not in model.rows[model.row_of(ids["join"])],
        timeout=WAIT,
    )
    assert model.index(model.row_of(ids["join"]), 1).data(TOOLTIP) is None
    qtbot.waitUntil(lambda: not links.fields["waits"].isVisible(), timeout=WAIT)


def test_the_graph_shows_each_step_in_its_states_colour_and_follows_the_states(farm, open_window, qtbot):
    flow_id, ids = diamond(farm)
    window = open_window(farm.url)
    qtbot.waitUntil(lambda: window.jobs.select(ids["join"]), timeout=WAIT)
    links = _details_of(window, qtbot, ids["join"])
    qtbot.waitUntil(lambda: links.links("flows") == [f"flow:{flow_id}"], timeout=WAIT)
    links.fields["flows"].linkActivated.emit(f"flow:{flow_id}")
    graph = window.flow_window.graph
    assert window.flow_window.isVisible()

    def coloured(states):
        return {ids[step]: (state, theme.JOB_STATE[state]) for step, state in states.items()}

    waiting = coloured(dict(fetch="queued", left="waiting", right="waiting", join="waiting"))
    qtbot.waitUntil(lambda: graph.shown() == waiting, timeout=WAIT)
    # Columns by depth: fetch, then left and right one above the other, then join.
    x = {step: graph.boxes[job].rect.x() for step, job in ids.items()}
    assert x["fetch"] < x["left"] == x["right"] < x["join"]
    assert "Workflow" in window.flow_window.title.text() and "0 of 4 done" in window.flow_window.title.text()

    farm.cancel(ids["fetch"])  # every step ends cancelled: the open graph follows
    qtbot.waitUntil(lambda: graph.shown() == coloured(dict.fromkeys(ids, "cancelled")), timeout=WAIT)
    assert "4 of 4 done" in window.flow_window.title.text()

    # A click on a step goes to its job.
    box = graph.boxes[ids["right"]]
    QTest.mouseClick(graph.viewport(), Qt.MouseButton.LeftButton, pos=graph.mapFromScene(box.rect.center()))
    _details_of(window, qtbot, ids["right"])

    window.flow_window.close()  # closed, it is read no more
    qtbot.waitUntil(lambda: window.snap.flow is None, timeout=WAIT)


def test_a_group_shows_its_members_as_a_block_before_its_callback(farm, open_window, qtbot):
    members = [farm.http_spec("/ok") for _ in range(50)]
    group_id = farm.group(members, callback=farm.http_spec("/done", method="POST"), name="tiles")
    info = farm.group_info(group_id)
    window = open_window(farm.url)
    window.show_flow(group_id)
    graph = window.flow_window.graph
    qtbot.waitUntil(lambda: len(graph.shown()) == 51, timeout=WAIT)
    callback = info["callback"]["id"]
    assert graph.shown()[callback] == ("waiting", theme.JOB_STATE["waiting"])
    others = [box.rect for job, box in graph.boxes.items() if job != callback]
    assert all(theme.JOB_STATE["queued"] == graph.shown()[job][1] for job in graph.boxes if job != callback)
    assert max(r.right() for r in others) < graph.boxes[callback].rect.left()  # the callback after the block
    assert len({r.x() for r in others}) > 1  # 50 members wrap into sub-columns rather than one tall column
    assert "Group" in window.flow_window.title.text() and "tiles" in window.flow_window.title.text()

    window.show_flow(group_id + 100)  # no such flow: said, rather than waited for
    qtbot.waitUntil(lambda: "There is no workflow or group" in window.flow_window.title.text(), timeout=WAIT)
    assert graph.shown() == {}


def test_a_waiting_job_names_only_the_parents_still_holding_it_back(farm, open_window, qtbot):
    first, second = farm.enqueue_http("/ok", count=2)
    [either] = farm.enqueue_http("/ok", after=[first, second], after_ended=True)  # runs once both have ended
    [both] = farm.enqueue_http("/ok", after=[first, second])
    farm.cancel(first)  # ended: it holds `either` back no more; `both` is cancelled with it
    window = open_window(farm.url)
    model = window.jobs.model
    qtbot.waitUntil(lambda: model.row_of(either) is not None, timeout=WAIT)
    assert model.index(model.row_of(either), 1).data(TOOLTIP) == f"waits for {second}"
    assert model.index(model.row_of(both), 1).data() == "cancelled"
