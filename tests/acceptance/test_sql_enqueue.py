"""The seed workload, end to end on a real PostgreSQL with real node processes: the log table, trigger and
qp_enqueue call of docs/sql-enqueue.md, run as written there; writers on several connections log interleaved
requests at once, and the farm processes every request's records in the order they were written, one at a time."""

import re
import threading
from collections import defaultdict

import pytest
from sqlalchemy import text

from queueprocessor import Farm
from queueprocessor.store.database import open_engine
from tests.support.work import FAST, PYJOBS, ROOT, NodeProcesses, wait_for

pytestmark = pytest.mark.postgres

REQUESTS, RECORDS, WRITERS = 12, 8, 4


def seed_sql() -> str:
    """The page's SQL block that makes the log table and its trigger, its target pointed at the tests' function."""
    page = (ROOT / "docs" / "sql-enqueue.md").read_text()
    [block] = [b for b in re.findall(r"```sql\n(.*?)```", page, re.S) if "CREATE TABLE esb_log" in b]
    return block.replace("'esb.records:process'", f"'{PYJOBS}:log_record'")


def write_log(url: str, requests: list[str]) -> None:
    """One ESB server: its requests' records, interleaved, each record committed on its own (with its job)."""
    engine = open_engine(url, pool_size=1)
    try:
        for seq in range(RECORDS):
            for request in requests:
                with engine.begin() as conn:
                    conn.execute(
                        text("INSERT INTO esb_log (request_id, seq, message) VALUES (:r, :s, :m)"),
                        dict(r=request, s=seq, m=f"record {seq} of {request}"),
                    )
    finally:
        engine.dispose()


def test_a_trigger_enqueues_every_log_record_and_the_farm_keeps_each_requests_order(pg_url, tmp_path, monkeypatch):
    records = tmp_path / "records.txt"
    monkeypatch.setenv("QP_TEST_RECORDS", str(records))  # the node processes inherit it
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
        with farm._engine.begin() as conn:
            conn.exec_driver_sql(seed_sql().replace("%", "%%"))
        nodes = NodeProcesses(pg_url, tmp_path)
        try:
            for name in ("esb-1", "esb-2", "esb-3"):
                nodes(name, capacity=4)
            requests = [f"req-{n:02d}" for n in range(REQUESTS)]
            writers = [threading.Thread(target=write_log, args=(pg_url, requests[w::WRITERS])) for w in range(WRITERS)]
            for writer in writers:
                writer.start()
            for writer in writers:
                writer.join()
            total = REQUESTS * RECORDS
            wait_for(lambda: farm.status()["jobs"].get("succeeded", 0) == total, timeout=120)
            jobs = farm.list_jobs(limit=total + 10)
            runs = {run["job_id"]: run for run in farm._store.runs.read(limit=10 * total)}
        finally:
            nodes.kill_all()

    assert len(jobs) == total and {job["queue"] for job in jobs} == {"esb"}
    processed: dict[str, list[int]] = defaultdict(list)
    for line in records.read_text().splitlines():
        request, seq = line.split()
        processed[request].append(int(seq))
    assert processed == {request: list(range(RECORDS)) for request in requests}, "each request in its order, once"
    by_request = defaultdict(list)
    for job in sorted(jobs, key=lambda j: j["id"]):
        by_request[job["order_key"]].append(runs[job["id"]])
    for request, ran in by_request.items():  # one at a time: each record began after the one before had ended
        assert all(a["finished_at"] <= b["started_at"] for a, b in zip(ran, ran[1:])), request
    assert len({run["machine_id"] for run in runs.values()}) > 1, "the farm shared the work"
