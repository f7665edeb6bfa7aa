"""A real OTLP/HTTP trace receiver for the tests, run as its own process: it decodes each POST /v1/traces body
(a protobuf ExportTraceServiceRequest, gzip or not) with opentelemetry-proto and appends one JSON line per span to
a file: service, trace and span ids, parent, name, kind, times (unix ns) and attributes.

    python -m tests.support.otlp_receiver PORT FILE
"""

from __future__ import annotations

import gzip
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def _value(any_value: Any) -> Any:
    """The Python value of an OTLP AnyValue."""
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def spans_of(body: bytes) -> list[dict[str, Any]]:
    """Every span of one ExportTraceServiceRequest, as plain dicts."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append({"service": resource.get("service.name"), "trace_id": span.trace_id.hex(),
                              "span_id": span.span_id.hex(), "parent_span_id": span.parent_span_id.hex(),
                              "name": span.name, "kind": span.kind, "start": span.start_time_unix_nano,
                              "end": span.end_time_unix_nano, "status": span.status.code,
                              "attributes": {kv.key: _value(kv.value) for kv in span.attributes}})
    return spans


def serve(port: int, out: Path) -> None:
    """Answer OTLP/HTTP trace exports on 127.0.0.1:port until killed, appending their spans to `out`."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                self.send_error(404 if self.path != "/v1/traces" else 415)
                return
            with out.open("a") as lines:
                for span in spans_of(body):
                    lines.write(json.dumps(span) + "\n")
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def read_spans(out: Path) -> list[dict[str, Any]]:
    """The spans the receiver wrote so far."""
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    serve(int(sys.argv[1]), Path(sys.argv[2]))
