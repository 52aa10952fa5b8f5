"""Traces (docs/design.md §12), end to end: a real OTLP/HTTP endpoint (tests/support/otlp.py, which decodes the
protobuf it receives) and real node processes. A job enqueued through qp_enqueue inside a traced transaction, run on
a node, calling the real HTTP target (which records the traceparent header it got), failing once and retried, gives
one trace whose spans link the enqueue, each claim, each run, the target's requests and the retry; the work gets its
run's context (HTTP, command, Python sync, async and batch); a take-over links to the killed node's run; an API
enqueue in an application's span makes the producer span the runs follow."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from sqlalchemy import text

from queueprocessor import Farm
from queueprocessor.tracing import traceparent_of
from tests.support.otlp import OtlpEndpoint
from tests.support.work import FAST, PYJOBS, ROOT, NodeProcesses, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def otlp(monkeypatch):
    """The endpoint the node processes a test starts export to (they inherit the environment), soon after each span
    ends."""
    endpoint = OtlpEndpoint()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # milliseconds
    yield endpoint
    endpoint.stop()


def traced_enqueue(farm: Farm, endpoint: str) -> str:
    """The caller: a span of its own around a transaction that enqueues through qp_enqueue, passing its context as
    the SQL door's last argument, as a trigger's caller would; exported to the same endpoint. Its traceparent."""
    provider = TracerProvider(resource=Resource.create({"service.name": "orders"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")))
    try:
        with provider.get_tracer("orders").start_as_current_span("place order", kind=trace.SpanKind.SERVER) as span:
            caller = traceparent_of(span)
            with farm._engine.begin() as conn:
                conn.execute(
                    text("SELECT qp_enqueue('http', '/fails-once/0', queue => 'orders', traceparent => :t)"),
                    dict(t=caller),
                )
    finally:
        provider.shutdown()
    assert caller is not None
    return caller


def test_one_trace_from_the_callers_transaction_to_the_target_and_the_retry(
    pg_url, tmp_path, monkeypatch, otlp, http_target
):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "farm")
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
        nodes = NodeProcesses(pg_url, tmp_path)
        try:
            nodes("traced", "--http-base", http_target.base_url, "--queues", "orders")
            caller = traced_enqueue(farm, otlp.url)
            trace_id, caller_span = caller.split("-")[1:3]
            [job] = farm.list_jobs()
            wait_for(lambda: farm.job(job["id"])["state"] == "succeeded", timeout=30)
            wait_for(lambda: len([s for s in otlp.trace(trace_id) if s["name"] == "settle orders"]) == 2, timeout=20)
        finally:
            nodes.kill_all()

    spans = otlp.trace(trace_id)
    assert {s["trace_id"] for s in spans} == {trace_id} and len(spans) == 7, [s["name"] for s in spans]
    [order] = [s for s in spans if s["span_id"] == caller_span]
    assert order["name"] == "place order" and order["service"] == "orders"
    received = sorted(
        (s for s in spans if s["name"] == "receive orders"), key=lambda s: s["attributes"]["queueprocessor.fence"]
    )
    runs = sorted(
        (s for s in spans if s["name"] == "process orders"), key=lambda s: s["attributes"]["queueprocessor.fence"]
    )
    settled = [s for s in spans if s["name"] == "settle orders"]
    assert len(received) == len(runs) == len(settled) == 2
    for claim, run in zip(received, runs):  # each claim: a child of the caller's span; each run, of its claim
        assert claim["parent"] == caller_span and claim["kind"] == "client" and claim["service"] == "farm"
        assert claim["attributes"]["messaging.message.id"] == str(job["id"])
        assert claim["attributes"]["queueprocessor.machine"] == "traced"
        assert run["parent"] == claim["span_id"] and run["kind"] == "consumer"
        assert {k: run["attributes"][k] for k in ("messaging.destination.name", "queueprocessor.executor")} == {
            "messaging.destination.name": "orders",
            "queueprocessor.executor": "http",
        }
    first, retry = runs
    assert [r["attributes"]["queueprocessor.attempt"] for r in runs] == [1, 2]
    assert [r["attributes"]["queueprocessor.outcome"] for r in runs] == ["failed", "succeeded"]
    assert first["links"] == [] and retry["links"] == [(trace_id, first["span_id"])], "the retry links its first run"
    assert sorted(s["parent"] for s in settled) == sorted(r["span_id"] for r in runs), "each finish under its run"
    assert {s["kind"] for s in settled} == {"client"} and {r["kind"] for r in runs} == {"consumer"}
    # What the target saw: each request carried its own run's context, so its spans are children of that run.
    requests = sorted(http_target.requests("/fails-once"), key=lambda r: r["fence"])
    assert [r["status"] for r in requests] == [500, 200]
    assert [r["traceparent"].split("-")[1:3] for r in requests] == [[trace_id, r["span_id"]] for r in runs]


def processed_spans(otlp: OtlpEndpoint) -> list[dict]:
    """The `process` spans received."""
    return [s for s in otlp.spans() if s["name"].startswith("process")]


def processed(otlp: OtlpEndpoint) -> dict[int, dict]:
    """The `process` spans received, by job id."""
    return {int(s["attributes"]["messaging.message.id"]): s for s in processed_spans(otlp)}


def test_the_work_gets_its_runs_context_python_sync_async_and_batch_and_a_command(pg_url, tmp_path, otlp):
    """Jobs enqueued through the API under a traceparent given (a fresh trace each): a Python function (sync and
    `async def`) runs with its run's span current and in context.traceparent; a batch function's jobs, called
    together, each have a span of their own, named in their contexts; a command gets it as TRACEPARENT."""
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
        nodes = NodeProcesses(pg_url, tmp_path)
        try:
            nodes("traced")
            given = {}
            for n, spec in enumerate(
                [
                    farm.python_spec(f"{PYJOBS}:seen_trace"),
                    farm.python_spec(f"{PYJOBS}:seen_trace_async"),
                    farm.command_spec(["sh", "-c", 'printf "%s" "$TRACEPARENT"']),
                ]
            ):
                traceparent = f"00-{n + 1:032x}-{n + 1:016x}-01"
                [job_id] = farm.submit(replace(spec, traceparent=traceparent)).ids
                given[job_id] = traceparent
            batched = []
            for n in (7, 8):
                spec = farm.python_spec(f"{PYJOBS}:seen_trace_batch", traceparent=f"00-{n:032x}-{n:016x}-01")
                batched += farm.submit(spec).ids
                given[batched[-1]] = spec.traceparent
            wait_for(lambda: all(farm.job(i)["state"] == "succeeded" for i in given), timeout=30)
            outputs = {i: [r["output"] for r in farm.job(i)["runs"]] for i in given}
            wait_for(lambda: set(processed(otlp)) == set(given), timeout=20)
        finally:
            nodes.kill_all()
    runs = processed(otlp)
    for job_id, traceparent in given.items():
        run = runs[job_id]
        assert run["trace_id"] == traceparent.split("-")[1]
        said = f"00-{run['trace_id']}-{run['span_id']}-01"
        [output] = outputs[job_id]
        if job_id in batched:  # a batch's job: its own span in its context, none current during the call
            assert json.loads(output) == {"current": None, "context": said}
        elif output.startswith("{"):
            assert json.loads(output) == {"current": said, "context": said}
        else:
            assert output == said  # the command's TRACEPARENT


def test_a_run_taken_over_from_a_killed_node_links_to_the_run_the_target_saw_first(pg_url, tmp_path, otlp, http_target):
    """The run of a job whose node was killed mid-request is taken over by another node: the new run, in the same
    trace, links to the killed one, by the span id the target got in the first request's traceparent (the killed
    node never sent that span: the link names it all the same, derived from the job and the fence)."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
        nodes = NodeProcesses(pg_url, tmp_path)
        try:
            victim = nodes("victim", "--http-base", http_target.base_url)
            wait_for(lambda: farm.serving("default"), timeout=20)
            [job_id] = farm.enqueue(farm.http_spec("/sleep/2", traceparent=traceparent))
            wait_for(lambda: http_target.requests("/sleep"), timeout=20)
            victim.kill()
            victim.wait()
            nodes("heir", "--http-base", http_target.base_url)
            wait_for(lambda: farm.job(job_id)["state"] == "succeeded", timeout=30)
            wait_for(lambda: 2 in {s["attributes"]["queueprocessor.fence"] for s in processed_spans(otlp)}, timeout=20)
            runs = sorted(farm.job(job_id)["runs"], key=lambda r: r["fence"])
        finally:
            nodes.kill_all()
    assert [(r["fence"], r["outcome"]) for r in runs] == [(1, "lost"), (2, "succeeded")]
    first, second = sorted(http_target.requests("/sleep"), key=lambda r: r["fence"])
    trace_id, first_run = first["traceparent"].split("-")[1:3]
    [heir] = [s for s in processed_spans(otlp) if s["attributes"]["queueprocessor.fence"] == 2]
    assert heir["trace_id"] == trace_id == traceparent.split("-")[1]
    assert heir["attributes"]["queueprocessor.machine"] == "heir"
    assert heir["links"] == [(trace_id, first_run)], "the take-over links to the run the target saw first"
    assert second["traceparent"].split("-")[1:3] == [trace_id, heir["span_id"]]


# An application that traces with the SDK as its global provider (in a process of its own: a global provider is set
# once a process), enqueueing through the API inside its span.
TRACED_APP = """
import sys
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from queueprocessor import Farm

provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)
with trace.get_tracer("shop").start_as_current_span("checkout") as span, Farm(sys.argv[1]) as farm:
    [job_id] = farm.enqueue(farm.python_spec("tests.support.pyjobs:noop"))
print(job_id, format(span.get_span_context().trace_id, "032x"))
provider.shutdown()
"""


def test_an_api_enqueue_in_a_span_makes_a_producer_span_the_runs_follow(pg_url, tmp_path, otlp):
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
        nodes = NodeProcesses(pg_url, tmp_path)
        try:
            nodes("traced")
            app = subprocess.run([sys.executable, "-c", TRACED_APP, pg_url], capture_output=True, text=True, cwd=ROOT)
            assert app.returncode == 0, app.stderr
            job_id, trace_id = app.stdout.split()
            wait_for(lambda: farm.job(int(job_id))["state"] == "succeeded", timeout=30)
            wait_for(lambda: any(s["name"] == "settle default" for s in otlp.trace(trace_id)), timeout=20)
        finally:
            nodes.kill_all()
    spans = {s["name"]: s for s in otlp.trace(trace_id)}
    assert set(spans) == {"checkout", "send default", "receive default", "process default", "settle default"}
    chain = ["checkout", "send default", "receive default", "process default", "settle default"]
    for parent, child in zip(chain, chain[1:]):
        assert spans[child]["parent"] == spans[parent]["span_id"], child
    assert spans["send default"]["kind"] == "producer"
    assert spans["send default"]["attributes"]["messaging.destination.name"] == "default"
