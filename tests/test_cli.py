"""The CLI as a user runs it: real subprocesses, options from flags, QP_* variables and TOML files."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from queueprocessor.farm import Farm
from tests.support.work import wait_for


def run(*args, env=None, db=None):
    command = [sys.executable, "-m", "queueprocessor.cli"] + (["--db", db] if db else []) + list(args)
    return subprocess.run(command, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


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
        jobs = {j["target"]: j for j in farm.store.list_jobs()}
    assert (jobs["/a"]["priority"], jobs["/a"]["max_attempts"]) == (3, 7)
    assert jobs["/b"]["priority"] == 9
    assert "/c" not in jobs  # QP_DB beat the config file's db
    with Farm(f"sqlite:///{other}") as farm:
        assert [j["target"] for j in farm.store.list_jobs()] == ["/c"]


def test_a_config_key_that_means_nothing_is_refused(tmp_path):
    config = tmp_path / "qp.toml"
    config.write_text("[node]\ncapasity = 3\n")
    done = run("--config", str(config), "status")
    assert done.returncode != 0
    assert done.stderr.strip() == (f"error: config file {config}: [node] has no option 'capasity': "
                                   "see `queueprocessor node --help`")


def test_json_documents_for_status_jobs_turns(sqlite_url):
    assert run("enqueue", "http", "/x", "--count", "3", db=sqlite_url).returncode == 0
    status = json.loads(run("status", "--json", db=sqlite_url).stdout)
    assert set(status) >= {"db_now", "database", "machines", "jobs", "settings"}
    assert status["jobs"]["queued"] == 3
    jobs = json.loads(run("jobs", "--json", db=sqlite_url).stdout)["jobs"]
    assert [j["id"] for j in jobs] == [3, 2, 1]
    assert {"owner", "attempts", "fence", "run_at", "created_at", "state"} <= set(jobs[0])
    assert json.loads(run("turns", "--json", db=sqlite_url).stdout) == {"turns": []}


def start_node(url, http_base, tmp_path):
    log = open(tmp_path / "node.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "queueprocessor.cli", "--db", url, "node", "--name", "solo",
                             "--http-base", http_base], stdout=log, stderr=subprocess.STDOUT)
    return proc, log


@pytest.mark.slow
def test_sigterm_drains_then_exits(sqlite_url, http_target, tmp_path):
    farm = Farm(sqlite_url)
    proc, log = start_node(sqlite_url, http_target.base_url, tmp_path)
    try:
        [job_id] = farm.enqueue_http("/sleep/1.5")
        wait_for(lambda: farm.store.get_job(job_id)["state"] == "running")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert farm.store.get_job(job_id)["state"] == "succeeded"
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
        wait_for(lambda: farm.store.get_job(job_id)["state"] == "running")
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
        job = farm.store.get_job(job_id)
        assert (job["state"], job["attempts"]) == ("queued", 0)  # back in the queue, no attempt spent
        assert farm.store.list_runs(job_id=job_id)[0]["outcome"] == "lost"
    finally:
        proc.kill()
        log.close()
        farm.close()
