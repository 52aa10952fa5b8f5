"""A real OTLP/HTTP endpoint for tests: a ThreadingHTTPServer on 127.0.0.1 that takes what an OpenTelemetry
exporter POSTs to /v1/traces (protobuf), decodes it with the opentelemetry-proto package, as a collector would, and
keeps every span it received: its trace and span ids (hex), parent, name, kind, attributes and links.
`spans()` gives them; `trace(trace_id)` those of one trace."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _value(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


class OtlpEndpoint:
    """The endpoint; `url` is what OTEL_EXPORTER_OTLP_ENDPOINT names (the exporter adds /v1/traces)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[dict] = []
        self.requests = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="OTLP", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def received(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)  # a body that is not an export request fails here: a 400 to the exporter
        spans = []
        for resource in request.resource_spans:
            service = {a.key: _value(a.value) for a in resource.resource.attributes}.get("service.name")
            for scope in resource.scope_spans:
                for span in scope.spans:
                    spans.append(
                        dict(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent=span.parent_span_id.hex() or None,
                            name=span.name,
                            kind=KINDS.get(span.kind),
                            service=service,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            status=span.status.code,
                            start=span.start_time_unix_nano,
                            end=span.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self._spans += spans
            self.requests += 1

    def spans(self) -> list[dict]:
        with self._lock:
            return [dict(span) for span in self._spans]

    def trace(self, trace_id: str) -> list[dict]:
        return [span for span in self.spans() if span["trace_id"] == trace_id]


def _handler(endpoint: OtlpEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                self._answer(404, b"")
                return
            try:
                endpoint.received(body)
            except Exception:  # noqa: BLE001 (a malformed body: the exporter hears of it)
                self._answer(400, b"")
                return
            self._answer(200, ExportTraceServiceResponse().SerializeToString())

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler
