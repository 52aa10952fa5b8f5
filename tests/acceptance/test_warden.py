"""The command warden on its own (queueprocessor.executors.warden): it kills a group whose deadline passes, ends
every group when its node's pipe closes, and a warden that dies is replaced by its node without losing a group."""

import logging
import math
import os
import signal
import subprocess
import time

from queueprocessor.executors.warden import Warden


def group() -> subprocess.Popen:
    """A process group of its own that would live 30 s: a shell and its sleep."""
    return subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)


def test_a_group_lives_while_its_deadline_is_extended_and_is_killed_once_it_is_not():
    warden = Warden()
    work = group()
    try:
        leash = warden.hold(work.pid, time.monotonic() + 1.0)
        for _ in range(5):  # renewed for 1.5 s, past its first deadline
            time.sleep(0.3)
            leash.extend(time.monotonic() + 1.0)
        assert work.poll() is None
        assert work.wait(5) == -signal.SIGKILL
    finally:
        work.kill()
        warden.close()


def test_a_stop_ends_the_group_and_its_grace_ends_one_that_ignores_it():
    warden = Warden()
    polite = group()
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"], start_new_session=True)
    try:
        for work in (polite, stubborn):
            warden.hold(work.pid, time.monotonic() + 30).stop(0.3)
        assert (polite.wait(5), stubborn.wait(5)) == (-signal.SIGTERM, -signal.SIGKILL)
    finally:
        polite.kill()
        stubborn.kill()
        warden.close()


def test_a_group_without_a_deadline_is_held_until_stopped():
    """A runner that is not given a lease to keep (as in tests) holds its commands with no deadline."""
    warden = Warden()
    work = group()
    try:
        leash = warden.hold(work.pid, math.inf)
        time.sleep(0.2)
        leash.stop(0.1)
        assert work.wait(5) == -signal.SIGTERM
        assert warden._process.poll() is None, "the warden itself ended"
    finally:
        work.kill()
        warden.close()


def test_a_closed_pipe_ends_every_group_as_its_node_died():
    warden = Warden()
    work = group()
    try:
        warden.hold(work.pid, time.monotonic() + 30)
        warden.close()  # as the node's death closes it
        assert work.wait(5) == -signal.SIGTERM
    finally:
        work.kill()


def test_a_dead_warden_is_noticed_replaced_and_its_groups_held_by_the_new_one(caplog):
    warden = Warden()
    work = group()
    try:
        leash = warden.hold(work.pid, time.monotonic() + 30)
        first = warden._process
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        with caplog.at_level(logging.WARNING, "queueprocessor.warden"):
            leash.extend(time.monotonic() + 30)  # the write that notices
        assert "the command warden was lost" in caplog.text
        assert warden._process is not first and work.poll() is None
        leash.stop(0.1)  # the new warden holds it
        assert work.wait(5) == -signal.SIGTERM
    finally:
        work.kill()
        warden.close()
