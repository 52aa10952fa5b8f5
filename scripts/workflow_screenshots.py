"""Render docs/app.md's pictures of workflows and groups: a diamond workflow's graph half way through, a group of 50
with its callback, and a waiting step's details in the Job runs tab.

    QT_QPA_PLATFORM=offscreen python scripts/workflow_screenshots.py [--out docs/screenshots]

A real farm on a throwaway SQLite database: one node calls the demo's web server, the app only watches. The
diamond's `index` step is slow, so the shot shows it running, `thumbnails` done and `report` waiting for it; the
group's members are quick, failing (a page that does not exist) or slow, so the shot shows every state at once.
"""

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from screenshots import pump, scratch_farm  # noqa: E402  (scripts/screenshots.py, beside this file)

from queueprocessor.demo import start_web_server  # noqa: E402
from queueprocessor.farm import Farm  # noqa: E402
from ui.app import make_app  # noqa: E402
from ui.mainwindow import MainWindow  # noqa: E402

SLOW = "/slow?ms=600000"  # runs for the whole shoot


def diamond(farm: Farm) -> int:
    flow = farm.workflow("nightly-import")
    flow.step("import", farm.http_spec("/ok?step=import"))
    flow.step("index", farm.http_spec(SLOW), after=["import"])
    flow.step("thumbnails", farm.http_spec("/ok?step=thumbnails"), after=["import"])
    flow.step("report", farm.http_spec("/ok?step=report", method="POST"), after=["index", "thumbnails"])
    return flow.enqueue()


def tiles(farm: Farm) -> int:
    """50 tiles: most quick, every seventh missing (fails at once), the last ones slow; stitched by a callback."""
    members = [
        farm.http_spec("/missing", max_attempts=1)
        if n % 7 == 3
        else farm.http_spec(SLOW if n >= 30 else f"/ok?tile={n}")
        for n in range(50)
    ]
    return farm.group(members, callback=farm.http_spec("/ok?stitch=1", method="POST"), name="render-tiles")


def states(window: MainWindow) -> set[str]:
    return {state for state, _ in window.flow_window.graph.shown().values()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/screenshots", help="Folder for the PNG files.")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    url = scratch_farm("qp-flow-shots-")
    web = start_web_server()
    farm = Farm(url)
    farm.settings(period=0.25, heartbeat=0.25)
    node = farm.node(name="render-01", http_base=f"http://127.0.0.1:{web.server_address[1]}/", capacity=4).start()
    make_app([], "light")
    window = MainWindow(url, None, interval=0.3)
    window.resize(1440, 900)
    window.show()
    try:
        flow_id = diamond(farm)
        window.show_flow(flow_id)
        window.flow_window.resize(900, 420)
        pump(30, lambda: states(window) == {"succeeded", "running", "waiting"})
        shot(window.flow_window, out / "workflow-light.png")
        report = farm.workflow_info(flow_id)["steps"][-1]["job_id"]
        window.show_job(report)
        pump(
            10,
            lambda: (
                "Waits" in window.jobs.details.links.titles["waits"].text() and window.jobs.details.links.isVisible()
            ),
        )
        shot(window, out / "workflow-job-light.png")

        group_id = tiles(farm)
        window.show_flow(group_id)
        window.flow_window.resize(1200, 760)
        pump(60, lambda: {"succeeded", "failed", "running", "queued", "waiting"} <= states(window))
        shot(window.flow_window, out / "group-light.png")
    finally:
        window.close()
        while window.isVisible():
            pump(0.1)
        node.stop(drain=False)
        farm.close()
        web.shutdown()


def shot(widget, path: Path) -> None:
    pump(0.8)
    widget.grab().save(str(path))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
