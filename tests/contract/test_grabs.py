"""Keyed grabs: the pair key + instance is done once; a loser learns who won and can wait for the result."""

import threading

import pytest

from queueprocessor.grabs import AlreadyTaken
from tests.support import pyjobs
from tests.support.work import Nodes, run_cli, wait_for


@pytest.fixture
def nodes(farm):
    started = Nodes(farm)
    yield started
    started.stop_all()


def test_of_many_simultaneous_grabs_exactly_one_wins(farm):
    barrier = threading.Barrier(6)
    won, lost = [], []

    def contender():
        barrier.wait()
        try:
            won.append(farm.grab("Report-26", "2026-11-22", farm.python_spec(pyjobs.noop)))
        except AlreadyTaken as taken:
            lost.append(taken)

    threads = [threading.Thread(target=contender) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(lost) == 5
    assert {taken.holder.job["id"] for taken in lost} == set(won)
    assert farm._store.jobs.counts()["queued"] == 1


def test_a_loser_is_told_who_won_and_whether_it_finished(farm, nodes):
    [job_id] = farm.enqueue_python(pyjobs.echo, {"r": 26}, key="Report-26@2026-11-22")
    with pytest.raises(AlreadyTaken) as early:
        farm.grab("Report-26", "2026-11-22", farm.python_spec(pyjobs.echo))
    assert str(early.value).startswith("Report-26@2026-11-22 was taken first by ")
    assert str(early.value).endswith(f"(job {job_id}): queued, not started yet")
    node = nodes("a")
    wait_for(lambda: farm._store.jobs.get(job_id)["state"] == "succeeded")
    with pytest.raises(AlreadyTaken) as late:
        farm.enqueue_python(pyjobs.echo, key="Report-26@2026-11-22")
    assert late.value.holder.finished and late.value.holder.machine == f"a ({node.id})"
    assert f"finished, succeeded on machine a ({node.id}) at " in str(late.value)


def test_other_instances_of_the_same_key_are_separate_work(farm):
    first = farm.grab("Report-26", "2026-11-22", farm.python_spec(pyjobs.noop))
    second = farm.grab("Report-26", "2026-11-23", farm.python_spec(pyjobs.noop))
    assert first != second


def test_grab_at_the_cli_refuses_the_loser_and_waits_for_the_winners_result(farm, nodes, capsys):
    url = farm.url
    assert run_cli("--db", url, "grab", "Report-26", "2026-11-22", "command", "--", "sh", "-c", "echo done") == 0
    assert capsys.readouterr().out.startswith("grabbed Report-26@2026-11-22: job ")
    assert run_cli("--db", url, "grab", "Report-26", "2026-11-22", "command", "--", "sh", "-c", "echo mine") == 3
    assert ": queued, not started yet" in capsys.readouterr().out
    nodes("a")
    code = run_cli("--db", url, "grab", "Report-26", "2026-11-22", "--wait", "command", "--", "sh", "-c", "echo x")
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[-1] == "done"  # the winner's output, not a second run
    assert "finished, succeeded on machine" in out[-2]
    assert farm._store.jobs.counts()["succeeded"] == 1


def test_a_bad_grab_is_one_line_at_the_cli(farm, capsys):
    assert run_cli("--db", farm.url, "grab", "Re@port", "x", "http", "/ok") == 1
    assert capsys.readouterr().err == (
        "error: grab key 'Re@port' and instance 'x' must be non-empty, the key without '@', together at most 399 "
        "characters\n"
    )
