"""Reading Retry-After (RFC 9110 §10.2.3) and how a throttled answer ends a run: seconds or a date snooze it (a date
read against the answer's own Date), garbage or no header is an ordinary failure, a huge delay is cut to the cap;
and a command's `retry-after:` lines."""

import math
from email.utils import formatdate

import pytest

from queueprocessor.executors import JobContext, JobFailed, Snooze
from queueprocessor.executors.command import asked_delay
from queueprocessor.executors.http import throttled
from queueprocessor.executors.retry_after import http_date, retry_after
from queueprocessor.node.runs import failed_end
from queueprocessor.rules.limits import SNOOZE_CAP
from queueprocessor.rules.states import Outcome

NOW = 1_700_000_000.0
SAID = "GET http://t/x answered HTTP 429"


@pytest.mark.parametrize("value, delay", [("120", 120.0), (" 0 ", 0.0), ("007", 7.0), ("86400000", 86400000.0)])
def test_delay_seconds(value, delay):
    assert retry_after(value, None, NOW) == delay


@pytest.mark.parametrize(
    "value",
    [
        "Tue, 14 Nov 2023 22:15:20 GMT",  # IMF-fixdate
        "Tuesday, 14-Nov-23 22:15:20 GMT",  # the obsolete RFC 850 form
        "Tue Nov 14 22:15:20 2023",  # the obsolete asctime form (no zone: GMT)
    ],
)
def test_an_http_date_in_every_form_is_read_against_the_answers_date(value):
    sent = "Tue, 14 Nov 2023 22:13:20 GMT"
    assert retry_after(value, sent, NOW) == 120.0
    assert http_date(value) == http_date(sent) + 120


def test_a_date_without_the_answers_date_is_read_against_this_machines_clock():
    assert retry_after(formatdate(NOW + 90, usegmt=True), None, NOW) == 90.0
    assert retry_after(formatdate(NOW + 90, usegmt=True), "not a date", NOW) == 90.0


def test_a_date_already_past_is_no_wait():
    assert retry_after(formatdate(NOW - 600, usegmt=True), None, NOW) == 0.0


@pytest.mark.parametrize("value", [None, "", "soon", "-5", "1.5", "12 s", "1e3", "٣", "Mon, 99 Foo 2023 25:61:00 GMT"])
def test_garbage_cannot_be_read(value):
    assert retry_after(value, None, NOW) is None


def test_a_throttled_answer_with_retry_after_snoozes_the_run_throttled():
    ending = throttled(SAID, "30", None, "slow down")
    assert isinstance(ending, Snooze) and (ending.delay, ending.throttled) == (30.0, True)
    assert str(ending) == f"{SAID}, Retry-After 30; back in 30 s"
    assert failed_end(ending) == (Outcome.SNOOZED, str(ending), None, False, 30.0, True)


@pytest.mark.parametrize("asked, why", [(None, "no Retry-After"), ("soon", "a Retry-After that is neither")])
def test_a_throttled_answer_without_a_readable_retry_after_is_an_ordinary_failure(asked, why):
    ending = throttled(SAID, asked, None, "slow down")
    assert type(ending) is JobFailed and ending.throttled and not ending.permanent
    assert str(ending).startswith(f"{SAID} with {why}")
    outcome, error, _, final, delay, marked = failed_end(ending)
    assert (outcome, final, delay, marked) == (Outcome.FAILED, False, None, True)


def test_a_huge_retry_after_is_cut_to_the_cap_and_the_record_says_so():
    ending = throttled(SAID, "999999", None, "")
    assert isinstance(ending, Snooze) and ending.delay == SNOOZE_CAP
    assert str(ending) == f"{SAID}, Retry-After 999999; back in 86400 s (the cap: it asked 999999 s)"


@pytest.mark.parametrize("seconds", [-1, math.nan, math.inf * -1, "30", None, True])
def test_a_snooze_of_anything_but_seconds_from_0_is_refused(seconds):
    with pytest.raises(ValueError, match="a snooze is a number of seconds from 0"):
        Snooze(seconds)


def test_context_snooze_ends_the_run_with_its_reason():
    context = JobContext(1, 1, 1, 1)
    with pytest.raises(Snooze) as raised:
        context.snooze(2.5)
    assert (raised.value.delay, str(raised.value), raised.value.throttled) == (
        2.5,
        "snoozed by the job; back in 2.5 s",
        False,
    )
    with pytest.raises(Snooze, match=r"^quota spent; back in 86400 s \(the cap: it asked inf s\)$"):
        context.snooze(math.inf, "quota spent")


@pytest.mark.parametrize(
    "line, seconds",
    [
        (b"retry-after: 30", 30.0),
        (b"retry-after:0.5\r", 0.5),
        (b"Retry-After: 30", None),  # lowercase, as documented: any other line is output
        (b"retry-after: soon", None),
        (b"retry-after: -1", None),
        (b"retry-after: inf", None),
        (b"retry-after: \xff", None),
        (b"  retry-after: 30", None),
    ],
)
def test_a_commands_retry_after_line(line, seconds):
    assert asked_delay(line) == seconds


def test_the_snoozes_writes_compile_for_sql_server():
    """No SQL Server runs here: the snooze's statements (its run's row, its job's update, the read of the counts)
    compile with the real dialect (the contract suite runs them where QP_TEST_MSSQL_URL names a server)."""
    from sqlalchemy import select, update
    from sqlalchemy.dialects.mssql import pyodbc

    from queueprocessor.store import runs
    from queueprocessor.store.schema import jobs

    dialect = pyodbc.dialect()
    guard = jobs.c.owner == 1
    made = [
        update(jobs).where(guard).values(runs.SNOOZED),
        runs._run_ended(1, guard),
        select(jobs.c.id, jobs.c.snoozes).where(jobs.c.id.in_([1, 2])),
    ]
    texts = [str(statement.compile(dialect=dialect)) for statement in made]
    assert "snoozes=(coalesce(qp_jobs.snoozes, " in texts[0] and "attempts=(qp_jobs.attempts - " in texts[0]
    assert texts[1].startswith("INSERT INTO qp_runs ") and "SELECT qp_jobs.id, qp_jobs.attempts" in texts[1]
