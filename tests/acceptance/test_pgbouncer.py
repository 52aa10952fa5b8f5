"""A farm whose nodes reach PostgreSQL through PgBouncer in transaction pooling mode (docs/pgbouncer.md): real node
processes take turns, claim, fail over, and ride out a restart of the pooler. (The store contract suite runs
through it too: tests/contract/test_store_contract.py.)"""

import os
import signal
import threading
import time

import pytest

from queueprocessor.farm import Farm
from queueprocessor.rules.states import MachineState
from tests.support.work import PYJOBS, NodeProcesses, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
NAMES = ("a", "b", "c")
PERIOD = 0.2  # NodeProcesses' (tests.support.work.FAST)


class DeathWatch:
    """Samples the machines' status as an operator's screen shows it; `dead` holds every live machine seen dead."""

    def __init__(self, farm: Farm):
        self.farm = farm
        self.dead: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="death-watch")

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            self.dead |= {m["name"] for m in self.farm.status()["machines"] if m["status"] == MachineState.DEAD}

    def __enter__(self) -> "DeathWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()


def test_turns_claims_a_pgbouncer_restart_and_failover_through_pgbouncer(pg_url, bouncer_url, pgbouncer, tmp_path):
    nodes = NodeProcesses(bouncer_url, tmp_path)
    with Farm(pg_url) as farm:  # the observer reads the server directly: the pooler's restart is the nodes' affair
        try:
            for name in NAMES:
                nodes(name, "--heartbeat", "0.5", capacity=8)
            wait_for(
                lambda: (
                    {m["name"] for m in farm.status()["machines"] if m["status"] == MachineState.ACTIVE} == set(NAMES)
                ),
                30,
            )
            time.sleep(2)  # every node in every roster
            check_rotation(farm)
            check_restart(farm, pgbouncer)
            check_failover(farm)
        finally:
            nodes.kill_all()
    for name in NAMES:  # no LISTEN through the pooler, and each node said so once
        assert (tmp_path / f"{name}.log").read_text().count("push is off") == 1


def check_rotation(farm: Farm) -> None:
    time.sleep(3)
    turns = sorted(farm.turns(seconds=2.5), key=lambda t: t["slot"])
    slots = [t["slot"] for t in turns]
    assert slots == list(range(slots[0], slots[0] + len(slots))) and len(slots) >= 10, "one turn in every slot"
    owners = [t["machine_id"] for t in turns]
    assert all(len(set(owners[i : i + 3])) == 3 for i in range(len(owners) - 2)), "turns rotate over all three"


def check_restart(farm: Farm, pgbouncer) -> None:
    """PgBouncer restarted while jobs flow: every job succeeds once, and nobody is declared dead. A claim whose
    answer the cut swallowed leaves a run that never started: its lease runs out and the job is claimed again."""
    ids = set(farm.enqueue_python(f"{PYJOBS}:nap", 0.005, count=400))
    with DeathWatch(farm) as watch:
        wait_for(lambda: farm.job_counts().get("succeeded", 0) >= 50, 30)
        pgbouncer.restart()
        wait_for(lambda: farm.job_counts().get("succeeded", 0) == len(ids), 60)
        time.sleep(1)  # a death verdict would show by now
    assert watch.dead == set()
    runs = [r for r in farm._store.runs.read(limit=10_000) if r["job_id"] in ids]
    assert sorted(r["job_id"] for r in runs if r["outcome"] == "succeeded") == sorted(ids)
    assert {r["outcome"] for r in runs} <= {"succeeded", "lost"}


def check_failover(farm: Farm) -> None:
    [job_id] = farm.enqueue_python(f"{PYJOBS}:sleep_async")
    owner = wait_for(lambda: (j := farm._store.jobs.get(job_id))["state"] == "running" and j["owner"], 10)
    victim = next(m for m in farm.status()["machines"] if m["id"] == owner)
    os.kill(victim["pid"], signal.SIGKILL)
    rerun = wait_for(lambda: next((r for r in farm._store.runs.read(job_id=job_id) if r["attempt"] == 2), None), 15)
    assert rerun["machine_id"] != owner
    assert [r["outcome"] for r in farm._store.runs.read(job_id=job_id) if r["attempt"] == 1] == ["lost"]


def test_through_a_pooler_no_statement_is_prepared(pg_url, bouncer_url):
    """psycopg prepares a statement run five times on one connection, and PgBouncer 1.18 keeps none past its
    transaction: connections through a pooler are told not to prepare (direct ones still do)."""
    with Farm(bouncer_url) as through, Farm(pg_url) as direct:
        for _ in range(20):
            assert through.status()["machines"] == []
        thresholds = []
        for farm in (through, direct):
            with farm._engine.connect() as conn:
                thresholds.append(conn.connection.dbapi_connection.prepare_threshold)
    assert thresholds == [None, 5]
