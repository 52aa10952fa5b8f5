"""The W3C traceparent a job keeps (rules/tracecontext.py), and the span id each run of it gets (tracing.py):
docs/design.md §12."""

import pytest

from queueprocessor.rules.errors import BadJobInput
from queueprocessor.rules.job import work_spec
from queueprocessor.rules.tracecontext import check_traceparent
from queueprocessor.tracing import run_span_id

GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_traceparent_is_kept_in_the_w3c_form_and_none_is_none():
    assert check_traceparent(GOOD) == GOOD
    assert check_traceparent(f" {GOOD.upper()}\n") == GOOD
    assert check_traceparent(None) is check_traceparent("") is check_traceparent("  ") is None  # an empty $TRACEPARENT
    assert work_spec("http", "/x", traceparent=GOOD).traceparent == GOOD
    assert work_spec("http", "/x").traceparent is None


@pytest.mark.parametrize(
    "bad",
    [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # no flags
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # a version this farm does not know
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # no trace
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # no parent
        "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",  # not hex
        GOOD + "-x",
    ],
)
def test_a_malformed_traceparent_is_refused_in_one_line(bad):
    with pytest.raises(
        BadJobInput, match=r"^traceparent '.*' is not a W3C traceparent: give 00-<32 hex trace id>"
    ) as refused:
        work_spec("http", "/x", traceparent=bad)
    assert "\n" not in str(refused.value)


def test_each_run_of_a_job_has_its_own_span_id_any_machine_can_name():
    trace = int(GOOD.split("-")[1], 16)
    ids = {run_span_id(trace, job, fence) for job in (1, 2) for fence in (1, 2, 3)}
    assert len(ids) == 6 and all(0 < i < 2**64 for i in ids)
    assert run_span_id(trace, 1, 2) == run_span_id(trace, 1, 2), "the next run links to it by the same derivation"
    assert run_span_id(trace + 1, 1, 2) != run_span_id(trace, 1, 2)


def test_a_tracers_failure_costs_the_runs_their_spans_never_their_work(caplog):
    from queueprocessor.tracing import _harmless

    @_harmless
    def claimed(*_runs):
        raise RuntimeError("the database is away")

    claimed([])  # the runner's call returns: the claim's jobs are started as ever
    assert "tracing: claimed failed: the database is away" in caplog.text
