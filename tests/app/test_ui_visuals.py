"""What the plots and panes show, checked on the data they draw (not on pixels): runs that overlap on one
machine each get a sub-row, no bar is too thin to see, legends name every colour, lane names do not pile up
with many machines, columns and odd stored values read well, and the colours keep WCAG AA contrast.
A real SQLite farm written as SQL would write it, read by the real Dashboard, drawn by real Qt widgets."""

import math
import os
import time
from dataclasses import replace

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtGui import QFontMetrics  # noqa: E402
from PySide6.QtWidgets import QApplication, QTabWidget, QWidget  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from queueprocessor.farm import Farm  # noqa: E402
from queueprocessor.rules.queues import OnFailure, QueueInfo  # noqa: E402
from queueprocessor.store.schema import jobs, machines, runs  # noqa: E402
from queueprocessor.views import Dashboard, FarmTiming, Query  # noqa: E402
from ui import text, theme  # noqa: E402
from ui.app import make_app  # noqa: E402
from ui.arrays import OUTCOMES  # noqa: E402
from ui.commands import Commands  # noqa: E402
from ui.gantt import MIN_PIXELS, RunsGantt  # noqa: E402
from ui.jobsview import JobDetails, JobsView  # noqa: E402
from ui.queuecharts import QueueCharts  # noqa: E402
from ui.queuegraph import QueueGraph  # noqa: E402
from ui.queuesview import QueuesView  # noqa: E402
from ui.snapshot import Snapshot  # noqa: E402
from ui.timeline import SlotsTimeline  # noqa: E402


@pytest.fixture
def app(qapp):
    return make_app([], "light")


@pytest.fixture
def farm(tmp_path):
    the_farm = Farm(f"sqlite:///{tmp_path / 'farm.db'}")
    the_farm.settings()
    yield the_farm
    the_farm.close()


def add_machines(farm: Farm, count: int, capacity: int = 4) -> list[int]:
    now = farm._store.ask_time()
    with farm._engine.begin() as conn:
        conn.execute(
            insert(machines),
            [
                dict(
                    name=f"node-{n:02d}",
                    host="host",
                    instance=f"i-{n}",
                    pid=n,
                    version="t",
                    state="active",
                    capacity=capacity,
                    running=0,
                    done_count=0,
                    failed_count=0,
                    joined_at=now - 60,
                    last_seen=now,
                    clock_offset=0.0,
                    rtt=0.001,
                    error_bound=0.001,
                )
                for n in range(count)
            ],
        )
        return [
            row[0] for row in conn.execute(machines.select().with_only_columns(machines.c.id).order_by(machines.c.id))
        ]


def add_runs(farm: Farm, spans: list[tuple[int, float, float, str]]) -> None:
    """(machine id, start, end, outcome) runs, each of its own job."""
    with farm._engine.begin() as conn:
        first = 1 + (conn.execute(jobs.select().with_only_columns(jobs.c.id).order_by(jobs.c.id.desc())).scalar() or 0)
        conn.execute(
            insert(jobs),
            [
                dict(
                    id=first + n,
                    executor="http",
                    target=f"/t/{n}",
                    method="GET",
                    state="succeeded",
                    priority=0,
                    run_at=start,
                    created_at=start,
                    attempts=1,
                    max_attempts=1,
                    fence=1,
                    started_at=start,
                    finished_at=end,
                    cancel_requested=False,
                )
                for n, (_, start, end, _) in enumerate(spans)
            ],
        )
        conn.execute(
            insert(runs),
            [
                dict(
                    job_id=first + n,
                    attempt=1,
                    machine_id=machine,
                    fence=1,
                    started_at=start,
                    finished_at=end,
                    outcome=outcome,
                    error=None,
                )
                for n, (machine, start, end, outcome) in enumerate(spans)
            ],
        )


def snapshot(farm: Farm, since: float, until: float, node_id: int | None = None, **query) -> Snapshot:
    reading = Dashboard(farm._store, FarmTiming.of(farm.settings())).read(Query(since=since, until=until, **query))
    return Snapshot.of(
        reading, node={"id": node_id} if node_id is not None else None, read_ms=0.0, mono=time.monotonic()
    )


def shown(widget, width=1000, height=320):
    widget.resize(width, height)
    widget.show()
    QApplication.processEvents()
    return widget


def test_overlapping_runs_of_one_machine_never_share_a_sub_row(app, farm):
    busy, quiet = add_machines(farm, 2)
    now = farm._store.ask_time()
    t = now - 50
    # A long singleton with short runs beside it, two of them overlapping each other too.
    spans = [
        (busy, t, t + 40, "succeeded"),
        (busy, t + 5, t + 6, "failed"),
        (busy, t + 10, t + 10.5, "lost"),
        (busy, t + 10.2, t + 12, "timeout"),
        (busy, t + 30, t + 31, "succeeded"),
        (quiet, t + 2, t + 3, "failed"),
    ]
    add_runs(farm, spans)
    gantt = shown(RunsGantt())
    snap = snapshot(farm, now - 60, now)
    gantt.show_snapshot(snap)
    gantt.view.setXRange(now - 60, now, padding=0)

    bars = gantt.plotted_bars()
    assert sorted((b["machine"], b["x0"], b["outcome"]) for b in bars) == sorted((m, s, o) for m, s, _, o in spans)
    end = {(m, s): e for m, s, e, _ in spans}
    for a in bars:
        lane = gantt.lane_index[a["machine"]]
        assert lane - 0.5 < a["y0"] and a["y0"] + a["height"] < lane + 0.5  # inside its machine's lane
        for b in bars:
            if a is not b and a["machine"] == b["machine"] and a["y0"] == b["y0"]:
                assert end[a["machine"], a["x0"]] <= b["x0"] or end[b["machine"], b["x0"]] <= a["x0"]
    assert len({b["y0"] for b in bars if b["machine"] == busy}) == 3  # the singleton and two short ones at once
    assert len({b["y0"] for b in bars if b["machine"] == quiet}) == 1  # one run: the lane's full height
    # Hovering a short run beside the singleton names the short run, not the singleton under it.
    lost = next(b for b in bars if b["outcome"] == "lost")
    assert "lost" in gantt.describe(t + 10.1, busy, lost["y0"] + lost["height"] / 2)


def test_a_run_of_a_millisecond_is_drawn_some_pixels_wide_at_any_zoom(app, farm):
    (machine,) = add_machines(farm, 1)
    now = farm._store.ask_time()
    add_runs(farm, [(machine, now - 30, now - 30 + 0.001, "failed")])
    gantt = shown(RunsGantt())
    gantt.view.setXRange(now - 60, now, padding=0)
    gantt.show_snapshot(snapshot(farm, now - 60, now))
    for span in (60, 600, 6):
        gantt.view.setXRange(now - span, now, padding=0)
        QApplication.processEvents()
        (bar,) = gantt.plotted_bars()
        assert gantt.pixel() == pytest.approx(span / gantt.view.width())
        assert bar["width"] >= MIN_PIXELS * gantt.pixel() * 0.95


def test_legends_name_every_colour_drawn(app):
    gantt, timeline, graph = RunsGantt(), SlotsTimeline(), QueueGraph()
    assert gantt.legend_labels() == list(OUTCOMES)
    assert [colour for _, colour, _ in gantt.legend()] == [theme.OUTCOME[o] for o in OUTCOMES]
    scheme = theme.current()
    assert [(mark, colour) for mark, colour, _ in timeline.legend()] == [
        ("fill", scheme.turn_claimed),
        ("fill", scheme.turn),
        ("outline", scheme.muted),
        ("event", scheme.accent),
        ("line", theme.OUTCOME["failed"]),
    ]
    for plot in (gantt, timeline):
        assert all(label.replace(" ", "&nbsp;") in plot.header.text() for label in plot.legend_labels())
    assert [label for _, _, label in graph.legends()["states"]] == ["queued", "running"]
    assert [label for _, _, label in graph.legends()["flow"]][:5] == [
        "succeeded",
        "failed",
        "timeout",
        "lost",
        "cancelled",
    ]


def test_the_timeline_and_gantt_fit_a_narrow_window(app):
    """Their title and legend wrap instead of holding the window wider than a 1024 px screen leaves them."""
    for plot in (SlotsTimeline(), RunsGantt()):
        assert plot.minimumSizeHint().width() < 500
        assert plot.plot.getPlotItem().titleLabel.text == ""  # no plot title: it would not wrap


def test_with_32_machines_lane_names_do_not_overlap_and_this_machine_is_named(app, farm):
    ids = add_machines(farm, 32)
    now = farm._store.ask_time()
    own = ids[17]
    for plot in (SlotsTimeline(), RunsGantt()):
        shown(plot, 1000, 300)
        plot.show_snapshot(snapshot(farm, now - 60, now, own))
        QApplication.processEvents()
        names = plot.shown_lane_names()
        axis = plot.plot.getPlotItem().getAxis("left")
        line = QFontMetrics(axis.style["tickFont"] or axis.font()).height()
        ticks = sorted(position for position, _ in axis._tickLevels[0])
        lane_px = plot.view.height() / 32
        assert min(b - a for a, b in zip(ticks, ticks[1:])) * lane_px >= line  # names a line apart at least
        assert "▸ node-17" in names and plot.own == own and plot.names[own] == "node-17"
        assert list(plot.own_band.opts["y0"]) == [plot.lane_index[own] - 0.5]  # its lane is highlighted
        plot.resize(1000, 900)  # room again: every lane named
        QApplication.processEvents()
        assert len(plot.shown_lane_names()) == 32


def test_a_payload_that_is_not_json_shows_as_its_text(app, farm):
    now = farm._store.ask_time()
    with farm._engine.begin() as conn:  # as a plain SQL insert could store it
        conn.execute(
            insert(jobs),
            [
                dict(
                    id=n,
                    executor="http",
                    target="/ok",
                    method="POST",
                    payload=payload,
                    state="queued",
                    priority=0,
                    run_at=now,
                    created_at=now,
                    attempts=0,
                    max_attempts=1,
                    fence=0,
                    cancel_requested=False,
                )
                for n, payload in ((1, "not json <b>at all</b>"), (2, '{"a": [1, 2]}'))
            ],
        )
    details = JobDetails()
    details.show_job(farm._store.jobs.get(1) | {"runs": []}, {})
    assert details.fields["payload"].text() == "not json <b>at all</b>"
    details.show_job(farm._store.jobs.get(2) | {"runs": []}, {})
    assert details.fields["payload"].text() == '{\n "a": [\n  1,\n  2\n ]\n}'


def test_a_job_filtered_out_leaves_no_row_selected_and_picking_another_shows_it(app, farm):
    farm.enqueue_http("/ok", count=5)
    now = farm._store.ask_time()
    view = shown(JobsView())
    picked = []
    view.job_selected.connect(picked.append)
    view.show_snapshot(snapshot(farm, now - 60, now))
    assert view.select(2) and picked == [2]
    view.show_snapshot(snapshot(farm, now - 60, now, jobs_text="5", job_id=2))  # the filter leaves job 5 only
    assert view.selected_job() is None  # not job 5 highlighted while the details still show job 2
    assert view.select(5) and picked == [2, 5]


def test_times_beyond_the_calendar_read_as_epoch_seconds():
    for epoch in (253402300800.0, 1e12, -1e12, 1e20, math.nan):
        assert text.clock(epoch).startswith("epoch ") and text.stamp(epoch).startswith("epoch ")
    now = time.time()
    assert ":" in text.clock(now) and "-" not in text.clock(now)  # today: the time of day only
    assert text.clock(now - 3 * 86400).count("-") == 2  # another day: with its date


def test_the_jobs_table_shows_the_error_before_the_times_and_gives_it_room(app):
    view = shown(JobsView(), 1200, 700)
    header = view.table.horizontalHeader()
    titles = [view.model.headerData(header.logicalIndex(n), header.orientation()) for n in range(header.count())]
    assert titles.index("Error") < titles.index("Created") < titles.index("Finished")
    assert header.sectionSize(7) >= 160
    attempts = view.details.attempts_view.horizontalHeader()
    titles = [
        view.details.attempts.headerData(attempts.logicalIndex(n), attempts.orientation())
        for n in range(attempts.count())
    ]
    assert titles.index("Outcome") < titles.index("Error") < titles.index("Started")


def test_the_unfinished_interval_is_pale_and_a_scrolled_back_graph_stays_put(app, farm):
    (machine,) = add_machines(farm, 1)
    bucket = snapshot(farm, 0, 120).bucket
    now = farm._store.ask_time()
    if not 1 <= now % bucket <= bucket - 2:  # the last run and the snapshot must fall in one interval
        time.sleep(bucket + 1 - now % bucket)
        now = farm._store.ask_time()
    add_runs(farm, [(machine, now - 100 + n, now - 99.5 + n, "succeeded") for n in range(100)])
    graph = shown(QueueGraph(), 1000, 600)
    snap = snapshot(farm, now - 120, now)
    graph.show_snapshot(snap)
    current = max(row["start"] for row in snap.throughput)
    assert current + snap.bucket > snap.db_now  # the last interval is still under way...
    assert list(graph.partial["succeeded"].opts["x0"]) == [pytest.approx(current + snap.bucket * 0.06)]
    assert current + snap.bucket * 0.06 not in list(graph.stack["succeeded"].opts["x0"])  # ...and drawn pale
    assert graph.plotted_throughput()["succeeded"] == 100  # every finished run is in a bar
    graph.flow.getViewBox().sigRangeChangedManually.emit(None)  # the user drags the graph back...
    graph.states.setXRange(now - 500, now - 400, padding=0)
    graph.show_snapshot(snapshot(farm, now - 120, now))
    assert not graph.follow
    assert graph.states.getViewBox().viewRange()[0] == pytest.approx([now - 500, now - 400])  # ...it stays there
    graph.set_follow(True)
    assert graph.states.getViewBox().viewRange()[0][1] > now


def test_a_plot_behind_a_tab_draws_nothing_and_draws_the_latest_data_when_its_tab_is_shown(app, farm):
    """The runs Gantt, the All jobs graph and the Queues tab alike: hidden, they keep the data but draw none of
    it; shown, they draw the latest snapshot; on screen, each new one at once."""
    (machine,) = add_machines(farm, 1)
    now = farm._store.ask_time()
    farm.enqueue_http("/later", delay=3600, queue="reports")
    add_runs(farm, [(machine, now - 30, now - 29, "succeeded")])
    older = snapshot(farm, now - 60, now)
    farm.enqueue_http("/later", delay=3600, queue="reports")
    add_runs(farm, [(machine, now - 20, now - 19, "failed")])
    latest = snapshot(farm, now - 60, now)
    gantt, graph, queues = RunsGantt(), QueueGraph(), QueuesView(Commands(lambda label, call: None))
    tabs = QTabWidget()
    for n, view in enumerate((QWidget(), gantt, graph, queues)):
        tabs.addTab(view, str(n))
    shown(tabs, 1000, 700)
    for snap in (older, latest):
        for view in (gantt, graph, queues):
            view.show_snapshot(snap)

    def drawn() -> dict:
        """What each view has drawn, read from its plot items and labels (without asking it to draw)."""
        _, queued = graph.lines["queued"].getData()  # None before the first draw
        return {
            "runs": sorted(float(x) for item in gantt.items.values() for x in item.opts["x0"]),
            "queued card": graph.counts["queued"].text(),
            "queued line": list(queued if queued is not None else []),
            "reports chart": [waiting for _, waiting, _ in queues.charts.charts["reports"].plotted()],
        }

    assert drawn() == {"runs": [], "queued card": "–", "queued line": [], "reports chart": []}
    for view in (gantt, graph, queues):
        tabs.setCurrentWidget(view)
    # Each drew the latest snapshot when shown, with every sample kept while it was hidden.
    assert drawn() == {
        "runs": [now - 30, now - 20],
        "queued card": "2",
        "queued line": [1.0, 2.0],
        "reports chart": [1, 2],
    }
    farm.enqueue_http("/later", delay=3600, queue="reports")
    newer = snapshot(farm, now - 60, now + 1)
    for view in (gantt, graph, queues):
        view.show_snapshot(newer)
    assert drawn()["reports chart"] == [1, 2, 3]  # on screen: drawn at once
    assert drawn()["queued card"] == "2"  # behind its tab again: not drawn


def test_the_sampled_plots_draw_their_history_and_forget_what_is_older(app, farm):
    """The All jobs graph and each queue's chart sample a count per snapshot; both keep `history` seconds."""
    graph = shown(QueueGraph(history=10.0), 1000, 600)
    charts = shown(QueueCharts(history=10.0), 700, 400)
    base = snapshot(farm, 0, 120)
    for now, waiting in ((100.0, 1), (105.0, 2), (112.0, 3)):
        graph.show_snapshot(replace(base, db_now=now, job_counts={"queued": waiting}, throughput=[]))
        reports = QueueInfo("reports", waiting, 1, None, None, 0, False, OnFailure.SKIP, ("web-1",))
        charts.add(now, [reports])
    assert [list(data) for data in graph.lines["queued"].getData()] == [[105.0, 112.0], [2.0, 3.0]]
    assert charts.draw(112.0, [reports]) == 105.0  # every chart starts at the oldest sample kept
    assert charts.charts["reports"].plotted() == [(105.0, 2, 1), (112.0, 3, 1)]


@pytest.mark.parametrize("scheme", [theme.LIGHT, theme.DARK])
def test_colours_keep_wcag_aa_contrast(scheme):
    for state, colour in theme.MACHINE_STATE.items():  # the state badge writes white on these
        assert theme.contrast("#ffffff", colour) >= 4.5, state
        assert theme.contrast(colour, scheme.base) >= 3, state  # and they mark rows as dots
    for colour in theme.JOB_STATE.values():  # the queue's numbers, on their cards
        assert theme.contrast(theme.readable(colour, scheme.base), scheme.base) >= 4.5
    for colour in (*theme.OUTCOME.values(), theme.JOB_STATE["queued"], scheme.turn, scheme.turn_claimed, scheme.muted):
        assert theme.contrast(colour, scheme.plot_bg) >= 3, colour  # bars, lines and outlines on the plot
    assert theme.contrast(scheme.turn, scheme.turn_claimed) >= 3  # a turn that claimed jobs vs one that did not
    for background in (*theme.MACHINE_STATE.values(), "#ffffff", "#16181c"):
        assert theme.contrast(theme.ink(background), background) >= 4.5
