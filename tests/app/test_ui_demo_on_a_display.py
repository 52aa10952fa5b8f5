"""The demo as a newcomer meets it, on a real X display (Xvfb): its farm running (`demo --headless`: three node
processes, the web target, the feeder) and the app's window on it, with the tour beside it. Every tab must show
something alive within seconds, and a tab added later without a check here fails the test."""

import os
import signal
import subprocess
import sys

import pytest

from tests.app.test_ui_on_a_display import _on, display  # noqa: F401 (the fixture)

SHOW_EVERY_TAB = """
import sys, time
from ui.app import make_app
from ui.mainwindow import MainWindow
app = make_app([], "light")
window = MainWindow(sys.argv[1], None, interval=0.2)
window.resize(1400, 860)
window.show()
help_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Help")
next(a for a in help_menu.actions() if a.text() == "&Tour").trigger()  # Help ▸ Tour, as a newcomer opens it
queue = window.queue
alive = {
    "Peers": lambda: window.peers.rowCount() >= 3,
    "Job runs": lambda: window.jobs.model.rowCount() > 0,
    "All jobs": lambda: any(line.xData is not None and len(line.xData) > 1 for line in queue.lines.values()),
    "Schedules": lambda: window.schedules.schedules_model.rowCount() > 0
    and window.schedules.singletons_model.rowCount() > 0,
    "Queues": lambda: {"mail", "partner", "reports", "tenants"} <= {row["name"] for row in window.queues.model.rows},
    "Events": lambda: window.event_log.model.rowCount() > 0,
}
deadline = time.monotonic() + 40
for index in range(window.tabs.count()):
    title = window.tabs.tabText(index)
    window.tabs.setCurrentIndex(index)
    check = alive.get(title, lambda: False)
    while time.monotonic() < deadline and not check():
        app.processEvents()
        time.sleep(0.02)
    print(title, check())
print("Tour", window.operator.tour.isVisible())
window.close()
while window.isVisible():
    app.processEvents()
    time.sleep(0.02)
"""


@pytest.mark.timeout(120)
def test_the_demo_opens_on_something_alive_in_every_tab(display, tmp_path):  # noqa: F811
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    env = _on(display, tmp_path)
    with subprocess.Popen(
        [sys.executable, "-m", "queueprocessor.cli", "--db", url, "demo", "--headless", "--seconds", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as farm:
        try:
            assert farm.stdout is not None
            said = farm.stdout.readline()
            assert said.startswith("demo farm on "), said  # its farm is set up, its nodes starting
            shown = subprocess.run(
                [sys.executable, "-c", SHOW_EVERY_TAB, url], env=env, capture_output=True, text=True, timeout=90
            )
        finally:
            os.killpg(farm.pid, signal.SIGTERM)  # the demo stops its nodes
            farm.wait(30)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        "Peers True",
        "Job runs True",
        "All jobs True",
        "Schedules True",
        "Queues True",
        "Events True",
        "Tour True",
    ], shown.stderr
