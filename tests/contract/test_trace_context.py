"""The trace context a job keeps (docs/design.md §12), on every backend: given, taken from the current span, copied
to each of `count` copies, and per member in a group whose members differ in what they carry."""

from opentelemetry import trace

from tests.support.work import run_cli

GIVEN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CURRENT = trace.SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, False, trace.TraceFlags(1))
CURRENT_SAID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def kept(farm, ids):
    found = farm._store.jobs.traceparents(list(ids))
    return [found.get(job_id) for job_id in ids]


def test_a_job_keeps_the_traceparent_given_or_current_and_copies_keep_it_too(farm):
    plain = farm.enqueue(farm.http_spec("/x"))
    given = farm.enqueue(farm.http_spec("/x", traceparent=GIVEN), count=3)
    with trace.use_span(trace.NonRecordingSpan(CURRENT)):  # a caller's span current (no SDK: its context kept)
        current = farm.enqueue(farm.http_spec("/x"))
        own = farm.enqueue(farm.http_spec("/x", traceparent=GIVEN))
    assert kept(farm, plain + given + current + own) == [None, GIVEN, GIVEN, GIVEN, CURRENT_SAID, GIVEN]


def test_a_groups_members_keep_each_their_own_or_the_current_one(farm):
    members = [
        farm.http_spec("/a", traceparent=GIVEN),
        farm.http_spec("/b", key="k", key_scope="waiting"),
        farm.http_spec("/c"),
    ]
    group = farm.group(members, callback=farm.http_spec("/done", method="POST"))
    ids = [job["id"] for job in sorted(farm.list_jobs(limit=10), key=lambda j: j["id"])]
    assert kept(farm, ids) == [GIVEN, None, None, None], "one statement's rows, each with its own"
    with trace.use_span(trace.NonRecordingSpan(CURRENT)):
        farm.group(
            [farm.http_spec("/d"), farm.http_spec("/e", traceparent=GIVEN)],
            callback=farm.http_spec("/f", method="POST"),
        )
    ids = [job["id"] for job in sorted(farm.list_jobs(limit=10), key=lambda j: j["id"])][4:]
    assert kept(farm, ids) == [CURRENT_SAID, GIVEN, CURRENT_SAID]
    assert farm.group_info(group)["callback"] is not None


def test_enqueue_takes_traceparent_or_the_environments_and_refuses_a_malformed_one_in_one_line(
    farm, db_url, monkeypatch, capsys
):
    monkeypatch.setenv("TRACEPARENT", CURRENT_SAID)
    assert run_cli("--db", db_url, "enqueue", "http", "/x") == 0
    assert run_cli("--db", db_url, "enqueue", "http", "/x", "--traceparent", GIVEN.upper()) == 0
    monkeypatch.setenv("TRACEPARENT", "")  # an empty variable, as an unset shell variable gives: none
    assert run_cli("--db", db_url, "enqueue", "http", "/x") == 0
    capsys.readouterr()
    assert run_cli("--db", db_url, "enqueue", "http", "/x", "--traceparent", "00-abc") != 0
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: --traceparent '00-abc' is not a W3C traceparent: give 00-<32 hex trace id>")
    ids = [job["id"] for job in sorted(farm.list_jobs(limit=10), key=lambda j: j["id"])]
    assert kept(farm, ids) == [CURRENT_SAID, GIVEN, None]
