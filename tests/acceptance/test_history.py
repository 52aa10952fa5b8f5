"""The farm's history (docs/design.md §11) as a user sees it: a real node writes each minute's row once the minute
is over, by itself, and `stats` prints it. On PostgreSQL, the farm's database: the test waits for a minute to end,
and the same writes on SQLite are tests/contract/test_stats.py's."""

import json
import subprocess
import sys

from queueprocessor.farm import Farm
from queueprocessor.store.stats import MINUTE
from tests.support.work import Nodes, wait_for


def test_a_node_writes_the_minute_its_jobs_ran_in_and_stats_prints_it(pg_url, http_target, tmp_path):
    db_url = pg_url
    with Farm(db_url) as farm:
        nodes = Nodes(farm, http_base=http_target.base_url)
        try:
            nodes("a")
            ids = farm.enqueue_http("/ok", count=3) + farm.enqueue_http("/status/500", max_attempts=1)
            wait_for(lambda: all(farm.job(j)["finished_at"] for j in ids))
            minutes = {int(farm.job(j)["finished_at"] // MINUTE * MINUTE) for j in ids}

            def written():
                rows = farm.stats(600, queue="default")
                return sum(r["succeeded"] + r["failed"] for r in rows if r["at"] in minutes) == 4 and rows

            rows = wait_for(written, timeout=2 * MINUTE + 15, interval=0.5)  # the minute must end first
        finally:
            nodes.stop_all()
    assert sum(r["enqueued"] for r in rows) == 4 and sum(r["failed"] for r in rows) == 1
    assert all(r["p50"] is not None for r in rows if r["succeeded"])
    shown = subprocess.run(
        [sys.executable, "-m", "queueprocessor.cli", "--db", db_url, "stats", "--since", "600", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert [r["queue"] for r in json.loads(shown.stdout)["stats"]] == ["default"] * len(rows)
    table = subprocess.run(
        [sys.executable, "-m", "queueprocessor.cli", "--db", db_url, "stats", "--step", "90"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert table.returncode != 0 and "step must be a whole number of minutes" in table.stderr
    assert "Traceback" not in table.stderr
