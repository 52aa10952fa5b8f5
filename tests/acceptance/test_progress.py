"""A running job's progress, end to end: a real node process runs a Python function that reports it, and the CLI
and the API show it live and keep it with the run."""

import json

import pytest

from queueprocessor import Farm
from queueprocessor.store.types import JobSpec
from tests.support.work import FAST, PYJOBS, NodeProcesses, run_cli, wait_for


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
