"""Singletons (continuous work on exactly one live machine) and the same lease as a Python lock."""

import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import select

from queueprocessor.farm import Farm
from queueprocessor.rules.errors import InvalidJob
from queueprocessor.singletons import LockHeld
from queueprocessor.store.schema import locks
from tests.support import pyjobs
from tests.support.tcpproxy import TcpProxy
from tests.support.work import NodeProcesses, Nodes, run_cli, wait_for

FEED = f"{pyjobs.__name__}:wait_for_cancel"  # continuous work: runs until told to stop


def tenures(farm, job_id, count):
    """The singleton's runs by fence, once there are `count` of them and only the last is still running."""

    def settled():
        runs = sorted(farm._store.runs.read(job_id=job_id), key=lambda run: run["fence"])
        return len(runs) == count and all(r["outcome"] != "running" for r in runs[:-1]) and runs

    return wait_for(settled, timeout=15)


@pytest.fixture
def nodes(farm):
    pyjobs.SEEN.clear()
    started = Nodes(farm)
    yield started
    started.stop_all()


def test_a_singleton_runs_on_exactly_one_machine_and_keeps_running(farm, nodes):
    a, b = nodes("a"), nodes("b")
    job_id = farm.singleton("feed", farm.python_spec(FEED))
    wait_for(lambda: farm._store.jobs.get(job_id)["state"] == "running")
    time.sleep(1.0)  # five heartbeats: its lease is renewed, nobody else takes it
    job = farm._store.jobs.get(job_id)
    assert job["state"] == "running" and job["owner"] in (a.id, b.id) and job["fence"] == 1
    assert [r["machine_id"] for r in farm._store.runs.read(job_id=job_id)] == [job["owner"]]
    with pytest.raises(InvalidJob, match="singleton 'feed' already exists \\(running on machine"):
        farm.singleton("feed", farm.python_spec(FEED))


def test_a_draining_machine_hands_its_singleton_over(farm, nodes):
    machines = {n.id: n for n in (nodes("a"), nodes("b"))}
    job_id = farm.singleton("feed", farm.python_spec(FEED))
    first = wait_for(lambda: farm._store.jobs.get(job_id)["owner"])
    farm.steer(str(first), "drain")
    wait_for(lambda: machines[first].stopped.is_set(), timeout=5)
    [other] = set(machines) - {first}
    runs = tenures(farm, job_id, 2)
    assert [(r["machine_id"], r["outcome"]) for r in runs] == [(first, "lost"), (other, "running")]
    assert runs[0]["error"] == "handed back: its machine is leaving the farm"


def test_a_singleton_whose_work_ends_is_started_again(farm, nodes):
    nodes("a")
    job_id = farm.singleton("ticker", farm.command_spec(["sh", "-c", "echo tick"]))
    wait_for(lambda: farm._store.runs.read(job_id=job_id) and farm._store.jobs.get(job_id)["state"] == "queued")
    job = farm._store.jobs.get(job_id)
    [run] = farm._store.runs.read(job_id=job_id)
    assert (run["outcome"], run["output"]) == ("succeeded", "tick\n")
    assert job["run_at"] > run["finished_at"]  # restarts after a pause, it does not spin


def test_removing_a_singleton_stops_it_and_frees_its_name(farm, nodes, capsys):
    nodes("a")
    job_id = farm.singleton("feed", farm.python_spec(FEED))
    wait_for(lambda: job_id in pyjobs.SEEN)
    assert run_cli("--db", farm.url, "singleton", "remove", "feed") == 0
    assert capsys.readouterr().out == "singleton feed: cancelling\n"
    wait_for(lambda: farm._store.jobs.get(job_id)["state"] == "cancelled", timeout=2)
    assert "noticed" in pyjobs.SEEN[job_id]
    again = farm.singleton("feed", farm.python_spec(FEED))
    assert again != job_id and farm._store.jobs.get(job_id)["key"] is None


@pytest.mark.slow
def test_a_dead_machines_singleton_is_taken_over_on_the_next_turn(farm, tmp_path):
    farm.settings(period=0.2, heartbeat=0.2)
    procs = NodeProcesses(farm.url, tmp_path)
    try:
        procs("a"), procs("b")
        wait_for(lambda: len(farm.status()["machines"]) == 2, timeout=20)
        job_id = farm.singleton("feed", farm.python_spec(FEED))
        first = wait_for(lambda: (j := farm._store.jobs.get(job_id))["state"] == "running" and j["owner"], timeout=20)
        name = next(m["name"] for m in farm.status()["machines"] if m["id"] == first)
        procs.procs[name].kill()
        runs = tenures(farm, job_id, 2)
        second = farm._store.jobs.get(job_id)["owner"]
        assert second != first
        assert [(r["machine_id"], r["fence"], r["outcome"]) for r in runs] == [
            (first, 1, "lost"),
            (second, 2, "running"),
        ]
    finally:
        procs.kill_all()


def test_a_lock_admits_one_holder_at_a_time_and_fences_each(farm):
    farm.settings(period=0.2, heartbeat=0.2)
    inside, overlaps, fences = [], [], []

    def worker():
        for _ in range(3):
            with farm.lock("ledger") as lock:
                if inside:
                    overlaps.append(lock.fence)
                inside.append(lock.fence)
                fences.append(lock.fence)
                time.sleep(0.02)
                inside.remove(lock.fence)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == [] and sorted(fences) == list(range(1, 10))


def test_a_held_lock_names_its_holder_and_a_lease_outlives_its_holders_pauses(farm):
    farm.settings(period=0.2, heartbeat=0.2)
    with farm.lock("ledger") as held:
        time.sleep(1.0)  # longer than the lease (0.6 s): renewed meanwhile
        with pytest.raises(LockHeld, match=f"lock 'ledger' is held by {held.holder}"):
            farm.lock("ledger", wait=0).acquire()
        assert not held.lost.is_set()


@pytest.mark.slow
def test_a_dead_holders_lock_is_taken_once_its_lease_runs_out(farm):
    farm.settings(period=0.2, heartbeat=0.2)
    code = (
        f"from queueprocessor import Farm; import time; f = Farm({farm.url!r}); l = f.lock('ledger').acquire(); "
        "print(l.fence, flush=True); time.sleep(60)"
    )
    holder_proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder_proc.stdout.readline().strip() == "1"
        with pytest.raises(LockHeld):
            farm.lock("ledger", wait=0.3).acquire()
        holder_proc.kill()
        with farm.lock("ledger", wait=5) as lock:
            assert lock.fence == 2
    finally:
        holder_proc.kill()
        holder_proc.wait()
        holder_proc.stdout.close()


class Stamped(threading.Event):
    """A lock's `lost`, stamped with the database's time read just after it was set: never earlier than the set."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.at = clock, None

    def set(self) -> None:
        super().set()
        self.at = self.clock()


@pytest.mark.postgres
@pytest.mark.parametrize("fault", ["freeze", "cut"])
def test_a_cut_off_holder_knows_it_may_have_lost_its_lock_before_anyone_else_takes_it(pg_server, pg_url, fault):
    """freeze: its renewal hangs unanswered; cut: each renewal fails at once. Default lease: 3 s, renewed every 1 s."""
    with (
        Farm(pg_url) as here,
        TcpProxy("127.0.0.1", pg_server.port) as proxy,
        Farm(pg_url.replace(f":{pg_server.port}/", f":{proxy.port}/")) as there,
    ):
        held = there.lock("ledger")
        held.lost = Stamped(here._store.ask_time)
        with held:
            getattr(proxy, fault)()
            try:
                with here.lock("ledger") as taker:
                    [(taken_at,)] = here._store.rows(select(locks.c.acquired_at).where(locks.c.name == "ledger"))
                    assert (taker.fence, held.lost.is_set()) == (2, True)
                    assert wait_for(lambda: held.lost.at) < taken_at
            finally:
                proxy.restore()


@pytest.mark.postgres
def test_a_lock_renewed_over_a_slow_link_is_kept(pg_server, pg_url):
    with (
        Farm(pg_url) as here,
        TcpProxy("127.0.0.1", pg_server.port) as proxy,
        Farm(pg_url.replace(f":{pg_server.port}/", f":{proxy.port}/")) as there,
    ):
        with there.lock("ledger") as held:
            proxy.up_delay = 0.8  # each renewal takes most of the 1 s between renewals
            time.sleep(4)  # longer than the 3 s lease
            assert not held.lost.is_set() and here.lock("ledger").held_by() == held.holder
            proxy.up_delay = 0
