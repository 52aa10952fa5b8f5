"""Killing a machine on this host from the app (Node ▸ Kill a Machine on This Host, the peers' right-click menu):
the check that never lets the wrong process be killed (ui/localkill.py), on real processes, and a real node process
killed from the window, whose running job the window's own node takes over once the lease ends."""

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QMessageBox  # noqa: E402

from queueprocessor.farm import Farm  # noqa: E402
from queueprocessor.nodeoptions import NodeConfig  # noqa: E402
from tests.app.test_ui_window import WAIT, app, open_window  # noqa: E402, F401  (fixtures)
from tests.support.work import NodeProcesses, wait_for  # noqa: E402
from ui import localkill  # noqa: E402
from ui.localkill import Here, Process, is_node, look, refusal  # noqa: E402
from ui.readonly import WATCHING  # noqa: E402

HOST = socket.gethostname()
OWN_ID = 1
# A process whose command line reads as the app's (`-m ui`) but that only sleeps: a node as far as /proc can tell.
NODE_LIKE = [sys.executable, "-c", "import time; time.sleep(60)", "-m", "ui"]
procfs = pytest.mark.skipif(not localkill.PROC.is_dir(), reason="needs /proc (Linux)")


@pytest.fixture
def spawn():
    """Starts processes, each returned once /proc shows its command line (a moment after exec it may read empty);
    whatever is left of them is killed at the end."""
    started = []

    def start(argv, wait=True):
        started.append(process := subprocess.Popen(argv))
        if wait:
            wait_for(lambda: (seen := look(process.pid)) is None or seen.argv == tuple(argv), timeout=5)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def row(pid, *, joined_ago=0.0, host=HOST, status="active", machine_id=7):
    """A machine's row as the snapshot has it (the columns the check reads), joined `joined_ago` seconds ago."""
    return dict(id=machine_id, name="demo-3", host=host, pid=pid, status=status, joined_at=time.time() - joined_ago)


def here(procfs=True):
    """This app, on a farm whose database clock is this host's (SQLite's)."""
    return Here(HOST, OWN_ID, os.getpid(), time.time(), procfs)


def check(machine, where=None):
    where = where or here()
    return refusal(machine, where, look(machine["pid"]))


@procfs
def test_this_apps_own_node_and_process_are_refused():
    assert check(row(os.getpid(), machine_id=OWN_ID)) == "this is this app's own node: drain it, or quit the app"
    assert check(row(os.getpid())) == f"pid {os.getpid()} is this app's own process"


@procfs
def test_a_machine_of_another_host_or_that_no_longer_checks_in_is_refused(spawn):
    node = spawn(NODE_LIKE)
    assert check(row(node.pid)) is None  # the same process, here and checking in: killable
    assert check(row(node.pid, host="web-07")) == f"demo-3 runs on web-07, not on this host ({HOST})"
    for status in ("dead", "stopped"):
        assert check(row(node.pid, status=status)) == f"demo-3 is {status}: it no longer checks in"
    assert check(row(node.pid), here(procfs=False)) == localkill.NO_PROC  # elsewhere than Linux


@procfs
def test_a_live_process_that_is_not_a_node_is_refused_with_what_it_is(spawn):
    sleeper = spawn(["sleep", "60"])
    assert check(row(sleeper.pid)) == f"process {sleeper.pid} is not a QueueProcessor node (sleep 60)"
    assert localkill.kill(row(sleeper.pid), here()) == (
        False,
        f"demo-3 not killed: process {sleeper.pid} is not a QueueProcessor node (sleep 60)",
    )
    assert sleeper.poll() is None


@procfs
def test_a_process_that_started_after_the_row_joined_has_taken_a_dead_nodes_pid(spawn):
    node = spawn(NODE_LIKE)
    why = check(row(node.pid, joined_ago=30))
    assert why == f"process {node.pid} started 30 s after demo-3 joined: another process has its pid now"
    assert check(row(node.pid, joined_ago=0.5)) is None  # /proc's ticks and the clocks' reading: within SLACK


@procfs
def test_a_pid_that_is_gone_or_has_ended_is_refused(spawn):
    done = spawn(["true"], wait=False)
    done.wait()
    assert look(done.pid) is None
    assert check(row(done.pid)) == f"process {done.pid} has already ended"
    assert localkill.kill(row(done.pid), here()) == (False, f"demo-3 (pid {done.pid}) had already ended")

    zombie = spawn(NODE_LIKE)  # killed, not yet reaped by its parent: /proc still lists it
    os.kill(zombie.pid, signal.SIGKILL)
    wait_for(lambda: look(zombie.pid).ended, timeout=5)
    assert check(row(zombie.pid)) == f"process {zombie.pid} has already ended"


@procfs
def test_kill_sends_sigkill_to_a_node_that_passes_the_check(spawn):
    node = spawn(NODE_LIKE)
    killed, said = localkill.kill(row(node.pid), here())
    assert killed and said.startswith(f"Killed demo-3 (pid {node.pid})")
    assert node.wait(timeout=5) == -signal.SIGKILL


def test_the_command_lines_of_a_node():
    for argv in (
        ("/srv/venv/bin/python", "/srv/venv/bin/queueprocessor", "node", "--name", "a"),  # the script
        ("/srv/venv/bin/queueprocessor", "node"),
        ("/usr/bin/python3", "-m", "queueprocessor.cli", "node", "--name", "demo-3"),  # the demo's nodes
        ("/usr/bin/python3", "-m", "ui", "--name", "demo-1"),  # the app, its node in-process
        ("/srv/venv/bin/python", "/srv/venv/bin/queueprocessor-gui"),
    ):
        assert is_node(argv), argv
    for argv in (
        ("sleep", "60"),
        ("sqlite3", "queueprocessor.db"),
        ("vim", "notes", "/srv/queueprocessor"),
        ("/usr/bin/python3", "-m", "uikit"),
        (),
    ):
        assert not is_node(argv), argv
    gone = Process(1234, ("/usr/bin/python3", "-m", "ui"), 10.0, ended=True)
    assert refusal(row(1234), here(), gone) == "process 1234 has already ended"


def kill_in_peer_menu(window, name):
    """Right-click the machine's row in the peers table: its Kill… action (the menu closed again)."""
    row_index = next(r for r in range(window.peers.rowCount()) if window.peers.index(r, 0).data() == name)
    window.operator.show_peer_menu(window.peers_view.visualRect(window.peers.index(row_index, 0)).center())
    [kill] = [a for a in window.operator.peer_menu.actions() if a.text().startswith("Kill ")]
    window.operator.peer_menu.close()
    return kill


@procfs
def test_a_window_that_only_watches_may_kill_nothing(tmp_path, spawn, open_window, qtbot):  # noqa: F811
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    node = spawn(NODE_LIKE)
    with Farm(url) as farm:  # a machine of this host that could be killed, but for the window
        farm._store.machines.register(
            name="demo-3", host=HOST, instance=uuid.uuid4().hex, pid=node.pid, version="test", capacity=1
        )
    window = open_window(url)  # --observe: no node of its own
    qtbot.waitUntil(lambda: window.snap is not None and len(window.snap.machines) == 1, timeout=WAIT)
    menu = window.act.kill.menuAction()
    assert not menu.isEnabled() and menu.toolTip() == f"Read-only: {WATCHING}"
    window.operator.fill_kill_menu()
    assert [(a.text(), a.isEnabled(), a.toolTip()) for a in window.act.kill.actions()] == [
        (f"demo-3 (pid {node.pid})…", False, f"Read-only: {WATCHING}")
    ]
    kill = kill_in_peer_menu(window, "demo-3")
    assert not kill.isEnabled() and kill.toolTip() == f"Read-only: {WATCHING}"
    assert node.poll() is None


TIMING = dict(period=0.2, heartbeat=0.2)  # a lease of 0.6 s (3 missed heartbeats)


@procfs
@pytest.mark.slow
def test_a_node_killed_from_its_peer_menu_dies_and_its_job_moves_here(tmp_path, open_window, qtbot):  # noqa: F811
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    nodes = NodeProcesses(url, tmp_path, timing=TIMING)
    with Farm(url) as farm:
        farm.settings(**TIMING, misses=3)
        try:
            victim = nodes("victim", capacity=1)
            # Its first run (fence 1) works for long; a run after a take-over ends at once.
            [job_id] = farm.enqueue_command(["sh", "-c", 'test "$QP_FENCE" != 1 || exec sleep 30'])
            wait_for(lambda: farm.job(job_id)["state"] == "running", timeout=20)
            window = open_window(url, NodeConfig(name="here", capacity=2, allow_commands=("sh",)))

            def victim_row():
                snap = window.snap
                return next((m for m in snap.machines if m["name"] == "victim"), None) if snap else None

            def ready():
                return window.snap is not None and window.snap.node is not None and victim_row()["status"] == "active"

            qtbot.waitUntil(ready, timeout=WAIT)
            assert victim_row()["pid"] == victim.pid

            # Node ▸ Kill a Machine on This Host lists it, and only it: not this app's own node.
            window.operator.fill_kill_menu()
            assert [(a.text(), a.isEnabled()) for a in window.act.kill.actions()] == [
                (f"victim (pid {victim.pid})…", True)
            ]

            # The peers' right-click menu: Kill victim (pid N)…, asked first, then the process dies by SIGKILL.
            kill = kill_in_peer_menu(window, "here")
            assert (
                not kill.isEnabled()
                and kill.toolTip() == "Not here: this is this app's own node: drain it, or quit the app"
            )
            kill = kill_in_peer_menu(window, "victim")
            assert kill.text() == f"Kill victim (pid {victim.pid})…" and kill.isEnabled()
            kill.trigger()
            box = window.operator.kill_confirm
            qtbot.waitUntil(lambda: box.isVisible(), timeout=WAIT)
            assert "not a drain" in box.informativeText() and "once its lease ends" in box.informativeText()
            box.button(QMessageBox.StandardButton.Yes).click()
            assert victim.wait(timeout=5) == -signal.SIGKILL
            assert window.statusBar().currentMessage().startswith(f"Killed victim (pid {victim.pid})")

            # Its job is taken over by this app's node once the lease ends.
            qtbot.waitUntil(lambda: farm.job(job_id)["state"] == "succeeded", timeout=WAIT)
            runs = farm.job(job_id)["runs"]
            machines = {m["name"]: m["id"] for m in window.snap.machines}
            assert sorted((r["fence"], r["machine_id"]) for r in runs) == [
                (1, machines["victim"]),
                (2, machines["here"]),
            ]

            # Dead now: no longer listed, and the peers' menu says why it may not be killed.
            qtbot.waitUntil(lambda: victim_row()["status"] == "dead", timeout=WAIT)
            window.operator.fill_kill_menu()
            assert [a.text() for a in window.act.kill.actions()] == ["(no other machine on this host)"]
            kill = kill_in_peer_menu(window, "victim")
            assert not kill.isEnabled() and kill.toolTip() == "Not here: victim is dead: it no longer checks in"
        finally:
            nodes.kill_all()
