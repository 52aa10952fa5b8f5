"""Traces (docs/design.md §12), with the `otel` extra: the enqueue's producer span, and a tracing node's claim, run
and finish spans in the trace each job keeps. The one module that imports OpenTelemetry, and only when asked: an
enqueuer that has not loaded it, or a node without an OTLP endpoint, imports and pays nothing of it (one check)."""

import contextvars
import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from .rules.job import Claimed, JobSpec

log = logging.getLogger("queueprocessor.tracing")

SYSTEM = "queueprocessor"  # messaging.system
API = "opentelemetry.trace"  # loaded: the process may be tracing (none of it is loaded here to find out)
ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_SPAN_ID: contextvars.ContextVar[int | None] = contextvars.ContextVar("qp_span_id", default=None)


def traceparent_of(span: Any) -> str | None:
    """A span's context as a W3C traceparent, or None if it has none valid."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _parent(traceparent: str) -> Any:
    """A context whose span is the one `traceparent` names (checked for form at every door: rules/tracecontext.py)."""
    from opentelemetry import trace

    _, trace_id, span_id, flags = traceparent.split("-")
    named = trace.SpanContext(int(trace_id, 16), int(span_id, 16), True, trace.TraceFlags(int(flags, 16)))
    return trace.set_span_in_context(trace.NonRecordingSpan(named))


def current_traceparent() -> str | None:
    """The current span's context as a traceparent, if one is current (API in sys.modules: the caller's check)."""
    from opentelemetry import trace

    return traceparent_of(trace.get_current_span())


def sending(spec: JobSpec) -> tuple[JobSpec, Any]:
    """An enqueue in a trace (the current one, or the spec's own traceparent), in a process that loaded
    OpenTelemetry (API in sys.modules: the caller's check): a `send {queue}` producer span, whose context the job
    keeps, to be ended once it is stored; else `spec` as it is, and no span."""
    from opentelemetry import trace

    parent = _parent(spec.traceparent) if spec.traceparent else None
    if parent is None and not trace.get_current_span().get_span_context().is_valid:
        return spec, None
    span = trace.get_tracer(SYSTEM).start_span(
        f"send {spec.queue}",
        context=parent,
        kind=trace.SpanKind.PRODUCER,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": spec.queue,
            "queueprocessor.executor": spec.executor,
        },
    )
    return replace(spec, traceparent=traceparent_of(span) or spec.traceparent), span


def run_span_id(trace_id: int, job_id: int, fence: int) -> int:
    """The span id of a job's run under `fence`, the same on every machine, so the next run (fence + 1: only a claim
    moves a fence) links to it without storing anything (docs/design.md §12)."""
    digest = hashlib.blake2b(f"{trace_id:032x}/{job_id}/{fence}".encode(), digest_size=8).digest()
    return int.from_bytes(digest) or 1


# The outcomes whose run span has an error status (a snooze or an operator's cancel is no error of the work's).
FAILED = ("failed", "timeout", "lost")


def _harmless(method: Callable[..., None]) -> Callable[..., None]:
    """A tracer's step whose failure (the database's read of the traceparents, the SDK) costs the runs their spans,
    never their work: it is logged, and the node goes on."""

    @functools.wraps(method)
    def step(*args: Any) -> None:
        try:
            method(*args)
        except Exception as error:  # noqa: BLE001
            log.warning("tracing: %s failed: %s (these runs' spans are incomplete)", method.__name__, error)

    return step


def node_tracer(machine: str) -> "NodeTracer | None":
    """A tracer for a node, if tracing is on: the extra installed, an OTLP endpoint named, the SDK not disabled.
    Otherwise None, and nothing of OpenTelemetry imported."""
    if not any(os.environ.get(name) for name in ENDPOINTS):
        return None
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    try:
        return NodeTracer(machine)
    except ImportError as error:
        log.warning("an OTLP endpoint is named but the otel extra is not installed (%s): not tracing", error)
        return None


class NodeTracer:
    """A tracing node's spans, kept on each run it holds (Running.trace): `receive` and `process` at the claim's
    hand-over, `settle` from its ending to its written finish."""

    def __init__(self, machine: str):
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        class _Ids(RandomIdGenerator):  # a run's span id as run_span_id says; any other at random
            def generate_span_id(self) -> int:
                return _SPAN_ID.get() or super().generate_span_id()

        resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES; unnamed: queueprocessor
        if str(resource.attributes.get("service.name", "unknown_service")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": SYSTEM}))
        self.provider = TracerProvider(resource=resource, id_generator=_Ids())
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer(SYSTEM)
        self.trace = trace
        self.machine = machine

    def shutdown(self) -> None:
        """Send what is left, then stop (a node's last act)."""
        self.provider.shutdown()

    @_harmless
    def claimed(
        self,
        runs: Sequence[Any],
        leased_at: float,
        slot: int | None,
        traceparents: Callable[[list[int]], dict[int, str]],
    ) -> None:
        """The runs of a claim sent at `leased_at` (monotonic), handed to the runner now: for each whose job keeps a
        traceparent (read in one statement), its `receive` span, and its `process` span begun."""
        found = traceparents([run.job.id for run in runs])
        if not found:
            return
        trace = self.trace
        now = time.time_ns()
        sent = now - int(max(0.0, time.monotonic() - leased_at) * 1e9) if leased_at > float("-inf") else now
        for run in runs:
            job: Claimed = run.job
            if (traceparent := found.get(job.id)) is None:
                continue
            parent = _parent(traceparent)
            trace_id = int(traceparent[3:35], 16)
            said: dict[str, Any] = {
                "messaging.system": SYSTEM,
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "queueprocessor.fence": job.fence,
                "queueprocessor.machine": self.machine,
            }
            received = self.tracer.start_span(
                f"receive {job.queue}",
                context=parent,
                kind=trace.SpanKind.CLIENT,  # a pull (the messaging conventions' kind for receive)
                start_time=sent,
                attributes=said
                | {"messaging.operation.type": "receive", "messaging.operation.name": "receive"}
                | ({} if slot is None else {"queueprocessor.slot": slot}),
            )
            received.end(now)
            links = []
            if job.fence > 1:
                before = trace.SpanContext(
                    trace_id, run_span_id(trace_id, job.id, job.fence - 1), True, trace.TraceFlags(1)
                )
                links.append(trace.Link(before, {"queueprocessor.link": "previous run"}))
            token = _SPAN_ID.set(run_span_id(trace_id, job.id, job.fence))
            try:
                run.trace = self.tracer.start_span(
                    f"process {job.queue}",
                    context=trace.set_span_in_context(received),
                    kind=trace.SpanKind.CONSUMER,
                    start_time=now,
                    links=links,
                    attributes=said
                    | {
                        "messaging.operation.type": "process",
                        "messaging.operation.name": "process",
                        "queueprocessor.attempt": job.attempts,
                        "queueprocessor.executor": job.executor,
                    },
                )
            finally:
                _SPAN_ID.reset(token)
            run.context.traceparent = traceparent_of(run.trace)

    @_harmless
    def ended(self, runs: Sequence[Any]) -> None:
        """Their endings are known: each `process` span ends with its outcome, and its `settle` span begins."""
        trace = self.trace
        for run in runs:
            span = run.trace
            if span is None or run.ending is None:
                continue
            outcome, error = run.ending[0], run.ending[1]
            span.set_attribute("queueprocessor.outcome", str(outcome))
            if outcome in FAILED:
                span.set_status(trace.Status(trace.StatusCode.ERROR, error))
            span.end()
            run.trace = self.tracer.start_span(
                f"settle {run.job.queue}",
                context=trace.set_span_in_context(span),
                kind=trace.SpanKind.CLIENT,
                attributes={
                    "messaging.system": SYSTEM,
                    "messaging.operation.type": "settle",
                    "messaging.operation.name": "settle",
                    "queueprocessor.outcome": str(outcome),
                },
            )

    @_harmless
    def written(self, runs: Sequence[Any]) -> None:
        """Their finishes are written (or given up on): each `settle` span ends."""
        for run in runs:
            if run.trace is not None:
                run.trace.end()
                run.trace = None


@contextmanager
def current(traceparent: str) -> Iterator[None]:
    """A Python job's work runs with its `process` span as the current context (a tracing node only)."""
    from opentelemetry import context

    token = context.attach(_parent(traceparent))
    try:
        yield
    finally:
        context.detach(token)
