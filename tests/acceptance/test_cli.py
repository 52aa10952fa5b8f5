"""The CLI as a user runs it: real subprocesses, options from flags, QP_* variables and TOML files."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import text

from queueprocessor import __version__
from queueprocessor.farm import Farm
from tests.support.tcpproxy import TcpProxy
from tests.support.work import wait_for


def run(*args, env=None, db=None):
    command = [sys.executable, "-m", "queueprocessor.cli"] + (["--db", db] if db else []) + list(args)
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_version_names_this_release_without_opening_a_farm():
    done = run("--version", env={"QP_DB": "postgresql://nobody@127.0.0.1:1/none"})
    assert (done.returncode, done.stdout.strip()) == (0, f"queueprocessor, version {__version__}"), done.stderr


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'farm.db'}"


def test_options_come_from_flags_then_environment_then_config(tmp_path, sqlite_url):
    config = tmp_path / "qp.toml"
    config.write_text(f'db = "{sqlite_url}"\n[enqueue.http]\npriority = 3\nmax_attempts = 7\n')
    assert run("--config", str(config), "enqueue", "http", "/a").returncode == 0
    assert run("--config", str(config), "enqueue", "http", "/b", "--priority", "9").returncode == 0
    other = tmp_path / "other.db"
    done = run("--config", str(config), "enqueue", "http", "/c", env={"QP_DB": f"sqlite:///{other}"})
    assert done.returncode == 0, done.stderr
    with Farm(sqlite_url) as farm:
        jobs = {j["target"]: j for j in farm._store.jobs.newest()}
    assert (jobs["/a"]["priority"], jobs["/a"]["max_attempts"]) == (3, 7)
    assert jobs["/b"]["priority"] == 9
    assert "/c" not in jobs  # QP_DB beat the config file's db
    with Farm(f"sqlite:///{other}") as farm:
        assert [j["target"] for j in farm._store.jobs.newest()] == ["/c"]


def test_help_names_the_environment_variable_of_every_option(sqlite_url):
    shown = run("enqueue", "http", "--help").stdout
    assert "[env var: QP_ENQUEUE_HTTP_PRIORITY; default: 0]" in " ".join(shown.split())
    assert run("enqueue", "http", "/x", env={"QP_ENQUEUE_HTTP_PRIORITY": "7"}, db=sqlite_url).returncode == 0
    with Farm(sqlite_url) as farm:
        assert [j["priority"] for j in farm._store.jobs.newest()] == [7]


def test_config_values_of_the_right_type_are_taken_as_they_are(tmp_path, sqlite_url):
    config = tmp_path / "qp.toml"
    config.write_text('[enqueue.http]\npriority = -2\ntimeout = 1.5\nkey = "k"\n')
    assert run("--config", str(config), "enqueue", "http", "/a", db=sqlite_url).returncode == 0
    with Farm(sqlite_url) as farm:
        [job] = farm._store.jobs.newest()
    assert (job["priority"], job["timeout"], job["key"]) == (-2, 1.5, "k")


def test_a_config_key_that_means_nothing_is_refused(tmp_path):
    config = tmp_path / "qp.toml"
    config.write_text("[node]\ncapasity = 3\n")
    done = run("--config", str(config), "status")
    assert done.returncode != 0
    assert done.stderr.strip() == (
        f"error: config file {config}: [node] has no option 'capasity': see `queueprocessor node --help`"
    )


def test_json_documents_for_status_jobs_turns(sqlite_url):
    assert run("enqueue", "http", "/x", "--count", "3", db=sqlite_url).returncode == 0
    status = json.loads(run("status", "--json", db=sqlite_url).stdout)
    assert set(status) >= {"db_now", "database", "machines", "jobs", "settings"}
    assert status["jobs"]["queued"] == 3
    jobs = json.loads(run("jobs", "--json", db=sqlite_url).stdout)["jobs"]
    assert [j["id"] for j in jobs] == [3, 2, 1]
    assert {"owner", "attempts", "fence", "run_at", "created_at", "state"} <= set(jobs[0])
    assert json.loads(run("turns", "--json", db=sqlite_url).stdout) == {"turns": []}


def test_status_lists_each_machines_queues_as_its_queues_option_says(sqlite_url):
    with Farm(sqlite_url) as farm:
        for name, queues in (("reporter", "reports:2,default"), ("anything", "")):
            farm._store.machines.register(
                name=name, host="h", instance=name, pid=1, version="t", capacity=4, queues=queues
            )
    rows = [line.split() for line in run("status", db=sqlite_url).stdout.splitlines()]
    shown = {row[1]: row[4] for row in rows if row[0].isdigit()}  # id, name, host, status, queues, ...
    assert shown == {"reporter": "reports:2,default", "anything": "all"}


@pytest.mark.parametrize(
    "argv", [["status"], ["jobs"], ["job", "1"], ["turns"], ["schedule", "list"], ["singleton", "list"]]
)
def test_a_read_command_on_a_missing_database_says_so_and_creates_nothing(tmp_path, argv):
    home = tmp_path / "home"  # the default database's folder is not there either
    for db in (f"sqlite:///{tmp_path / 'nowhere' / 'farm.db'}", None):
        done = run(*argv, db=db, env={"HOME": str(home), "XDG_DATA_HOME": str(home / "data"), "QP_DB": ""})
        assert done.returncode == 1 and done.stdout == ""
        assert re.fullmatch(
            r"error: there is no QueueProcessor farm in sqlite:///\S+farm.db yet: start a node "
            r"there, or run `queueprocessor init-db`\n",
            done.stderr,
        ), done.stderr
    assert list(tmp_path.iterdir()) == []


def test_reading_a_new_farm_leaves_its_timing_to_the_first_node(sqlite_url):
    assert run("enqueue", "http", "/x", db=sqlite_url).returncode == 0
    for argv in (["status"], ["status", "--json"], ["jobs"], ["job", "1"], ["turns"], ["schedule", "list"]):
        done = run(*argv, db=sqlite_url)
        assert done.returncode == 0, done.stderr
    with Farm(sqlite_url) as farm:
        assert farm.settings(period=2.0, heartbeat=0.5)["period"] == 2.0  # not already fixed at the defaults


@pytest.mark.parametrize("argv", [["jobs"], ["status", "--json"], ["--help"]])
def test_a_reader_that_leaves_early_gets_no_traceback(sqlite_url, argv):
    assert run("enqueue", "http", "/x", "--count", "60", db=sqlite_url).returncode == 0
    command = [sys.executable, "-m", "queueprocessor.cli", "--db", sqlite_url, *argv]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # `| head -1` that has read its line: every write now fails with EPIPE
    errors = proc.stderr.read()
    proc.stderr.close()
    assert (proc.wait(60), errors) == (1, "")


def test_times_no_date_can_show_are_listed_as_epoch_seconds(sqlite_url):
    """Rows written by SQL, past what the CLI and the API accept: every reader still lists them."""
    with Farm(sqlite_url) as farm:
        [job_id] = farm.enqueue_http("/x")
        farm.schedule("far", farm.python_spec("tests.support.pyjobs:echo"), every=60)
        farm._store.count(text("UPDATE qp_jobs SET run_at = 1e300, lease_until = -1e13 WHERE id = :id"), {"id": job_id})
        farm._store.count(text("UPDATE qp_schedules SET next_run = 1e15, every = 1e300"))
    for argv, shown in ((["jobs"], "1e+300"), (["job", str(job_id)], "-1e+13"), (["schedule", "list"], "1e+15")):
        done = run(*argv, db=sqlite_url)
        assert done.returncode == 0 and shown in done.stdout, done.stderr


@pytest.mark.slow
def test_the_demo_leaves_no_work_in_the_default_farm(tmp_path):
    data = tmp_path / "data"
    env = {"HOME": str(tmp_path), "XDG_DATA_HOME": str(data), "QP_DB": ""}
    done = run("demo", "--headless", "--seconds", "3", "--nodes", "1", env=env)
    assert done.returncode == 0, done.stderr
    assert not (data / "queueprocessor" / "farm.db").exists()  # where `node` and every command look by default
    with Farm(f"sqlite:///{data / 'queueprocessor' / 'demo.db'}", read_only=True) as demo:
        assert demo.get_schedule("demo-report")  # the demo's work stays in the demo's own file
    assert "there is no QueueProcessor farm" in run("jobs", env=env).stderr


@pytest.mark.slow
def test_the_demo_starts_afresh_so_the_last_runs_machines_do_not_linger(tmp_path):
    data = tmp_path / "data"
    env = {"HOME": str(tmp_path), "XDG_DATA_HOME": str(data), "QP_DB": ""}
    for _ in range(2):
        done = run("demo", "--headless", "--seconds", "2", "--nodes", "2", env=env)
        assert done.returncode == 0, done.stderr
    with Farm(f"sqlite:///{data / 'queueprocessor' / 'demo.db'}", read_only=True) as demo:
        assert sorted(m["name"] for m in demo.status()["machines"]) == ["demo-1", "demo-2"]  # each once


@pytest.mark.postgres
@pytest.mark.parametrize("timeout", ["", "?connect_timeout=1"], ids=["default timeout", "the URL's timeout"])
def test_a_server_that_never_answers_gets_one_line_not_a_hang(pg_server, pg_url, timeout):
    with TcpProxy("127.0.0.1", pg_server.port) as proxy:
        proxy.freeze()  # the connection is accepted, then not one byte comes back
        url = pg_url.replace(f":{pg_server.port}/", f":{proxy.port}/") + timeout
        done = run("status", db=url)
        proxy.restore()
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: cannot use the database postgresql+psycopg://postgres:***@") and "timeout" in line
    assert pg_server.password not in done.stderr


def start_node(url, http_base, tmp_path):
    log = open(tmp_path / "node.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "queueprocessor.cli", "--db", url, "node", "--name", "solo", "--http-base", http_base],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return proc, log


@pytest.mark.slow
def test_sigterm_drains_then_exits(sqlite_url, http_target, tmp_path):
    farm = Farm(sqlite_url)
    proc, log = start_node(sqlite_url, http_target.base_url, tmp_path)
    try:
        [job_id] = farm.enqueue_http("/sleep/1.5")
        # Its work under way, as the target sees it: a job claimed but not yet begun is handed back by a drain.
        wait_for(lambda: http_target.requests("/sleep"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert farm._store.jobs.get(job_id)["state"] == "succeeded"
        assert farm.status()["machines"][0]["status"] == "stopped"
    finally:
        proc.kill()
        log.close()
        farm.close()


@pytest.mark.slow
def test_a_second_interrupt_leaves_at_once_and_hands_jobs_back(sqlite_url, http_target, tmp_path):
    farm = Farm(sqlite_url)
    proc, log = start_node(sqlite_url, http_target.base_url, tmp_path)
    try:
        [job_id] = farm.enqueue_http("/sleep/30")
        wait_for(lambda: farm._store.jobs.get(job_id)["state"] == "running")
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
        job = farm._store.jobs.get(job_id)
        assert (job["state"], job["attempts"]) == ("queued", 0)  # back in the queue, no attempt spent
        assert farm._store.runs.read(job_id=job_id)[0]["outcome"] == "lost"
    finally:
        proc.kill()
        log.close()
        farm.close()


@pytest.mark.slow
def test_tables_and_json_name_the_machines(sqlite_url, http_target, tmp_path):
    """Operators know machines by name: jobs, job, turns and their JSON carry the name beside the id."""
    farm = Farm(sqlite_url)
    proc, log = start_node(sqlite_url, http_target.base_url, tmp_path)
    try:
        [job_id] = farm.enqueue_http("/ok")
        wait_for(lambda: farm.job(job_id)["state"] == "succeeded")
        machine = farm.status()["machines"][0]["id"]
        [row] = json.loads(run("jobs", "--json", db=sqlite_url).stdout)["jobs"]
        assert (row["owner"], row["owner_name"]) == (machine, "solo")
        record = json.loads(run("job", str(job_id), "--json", db=sqlite_url).stdout)
        assert [(r["machine_id"], r["machine_name"]) for r in record["runs"]] == [(machine, "solo")]
        turns = json.loads(run("turns", "--json", db=sqlite_url).stdout)["turns"]
        assert turns and {(t["machine_id"], t["machine_name"]) for t in turns} == {(machine, "solo")}
        label = f"solo ({machine})"
        assert label in run("jobs", db=sqlite_url).stdout
        shown = run("job", str(job_id), db=sqlite_url).stdout
        assert f"owner: {label}" in shown and shown.count(label) == 2  # the owner line and the attempt's row
        assert label in run("turns", db=sqlite_url).stdout
    finally:
        proc.kill()
        proc.wait()
        log.close()
        farm.close()
