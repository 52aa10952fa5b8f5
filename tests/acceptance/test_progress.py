"""A running job's progress, end to end: a real node process runs a Python function that reports it, and the CLI
and the API show it live and keep it with the run."""

import json

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from queueprocessor import Farm
from queueprocessor.rules.job import JobSpec
from queueprocessor.store.base import Raw
from tests.support.work import FAST, PYJOBS, NodeProcesses, Nodes, run_cli, wait_for


@pytest.fixture
def farm(db_url):
    with Farm(db_url) as the_farm:
        the_farm.settings(**FAST)
        yield the_farm


@pytest.fixture
def processes(db_url, tmp_path):
    started = NodeProcesses(db_url, tmp_path)
    yield started
    started.kill_all()


def cli_json(capsys, db_url, *argv):
    capsys.readouterr()
    assert run_cli("--db", db_url, *argv, "--json") == 0
    return json.loads(capsys.readouterr().out)


def test_a_function_reports_progress_seen_live_in_the_cli_and_kept_with_its_run(
    farm, processes, db_url, tmp_path, capsys
):
    gate = tmp_path / "gate"
    processes("worker")
    [job_id] = farm.enqueue(JobSpec(executor="python", target=f"{PYJOBS}:halfway", payload=json.dumps(str(gate))))
    shown = wait_for(lambda: (j := cli_json(capsys, db_url, "job", str(job_id)))["progress"] is not None and j)
    assert (shown["state"], shown["progress"], shown["progress_message"]) == ("running", 0.5, "half way")
    [listed] = [j for j in cli_json(capsys, db_url, "jobs")["jobs"] if j["id"] == job_id]
    assert (listed["progress"], listed["progress_message"]) == (0.5, "half way")
    [running] = shown["runs"]
    assert (running["outcome"], running["progress"]) == ("running", 0.5)

    assert run_cli("--db", db_url, "jobs") == 0
    assert "50% half way" in capsys.readouterr().out
    assert run_cli("--db", db_url, "job", str(job_id)) == 0
    assert "progress: 50% half way" in capsys.readouterr().out

    gate.touch()
    done = wait_for(lambda: (j := farm.job(job_id))["state"] == "succeeded" and j)
    [run] = done["runs"]
    assert (run["outcome"], run["progress"], run["progress_message"]) == ("succeeded", 0.5, "half way")


def test_a_command_reports_progress_by_a_line_of_its_output(farm, processes, db_url, tmp_path, capsys):
    gate = tmp_path / "gate"
    processes("worker")
    said = 'echo "QP_PROGRESS 0.3 copied 3 of 10"; echo "QP_PROGRESS lots"'
    script = f"{said}; while [ ! -e {gate} ]; do sleep 0.05; done"
    [job_id] = farm.enqueue_command(["sh", "-c", script])
    shown = wait_for(lambda: (j := cli_json(capsys, db_url, "job", str(job_id)))["progress"] is not None and j)
    assert (shown["state"], shown["progress"], shown["progress_message"]) == ("running", 0.3, "copied 3 of 10")
    gate.touch()
    done = wait_for(lambda: (j := farm.job(job_id))["state"] == "succeeded" and j)
    [run] = done["runs"]
    assert run["progress"] == 0.3 and "QP_PROGRESS lots" in run["output"]  # a malformed line is output, no more


def test_reports_are_coalesced_into_the_lease_renewals(db_url, tmp_path, monkeypatch):
    """10,000 reports in a moment cost no statement of their own: every write of progress is a lease renewal (it
    sets lease_until, under the owner and fence), there are no more of them than renewals, and the latest report
    is what the job shows and its run keeps."""
    sent: list[str] = []

    def record(conn, cursor, statement, *args):
        sent.append(" ".join(statement.split()))

    straight = Raw.run  # PostgreSQL's hot statements go straight to the driver: note them on their way

    def noted(raw, conn, statement, params):
        record(conn, None, str(statement.compile(dialect=raw.engine.dialect)))
        return straight(raw, conn, statement, params)

    monkeypatch.setattr(Raw, "run", noted)

    with Farm(db_url) as farm:
        farm.settings(**FAST)
        node = Nodes(farm)("here")
        gate = tmp_path / "gate"
        event.listen(Engine, "before_cursor_execute", record)
        try:
            [job_id] = farm.enqueue(JobSpec("python", f"{PYJOBS}:chatty", payload=json.dumps(str(gate))))
            wait_for(lambda: farm.job(job_id)["progress"] == 1.0)
            gate.touch()
            done = wait_for(lambda: (j := farm.job(job_id))["state"] == "succeeded" and j)
        finally:
            event.remove(Engine, "before_cursor_execute", record)
            node.stop(drain=False)
    writes = [s for s in sent if s.startswith("UPDATE qp_jobs SET") and "progress=CASE" in s]  # a claim sets NULL
    renewals = [s for s in sent if s.startswith("UPDATE qp_jobs SET lease_until=")]
    assert writes and all(s in renewals for s in writes), "progress is only ever written with a renewal"
    assert len(writes) <= len(renewals) < 100
    assert (done["runs"][0]["progress"], done["runs"][0]["progress_message"]) == (1.0, "step 10000")
