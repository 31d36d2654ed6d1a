"""Train-step spans through the real OTel SDK: its in-memory exporter, and the OTLP/HTTP exporter
sending to a receiver that decodes what a collector would get."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from vigil.model import VigilInputError
from vigil.run.launcher import launch
from vigil.sources.probe.otel import SPAN_NAME, StepTracer, otlp_provider, tracer_from_env
from vigil.sources.probe.probe import Probe

Traced = tuple[StepTracer, InMemorySpanExporter]


@pytest.fixture
def traced() -> Traced:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return StepTracer(provider=provider, job="j7", rank=3), exporter


def test_step_span_carries_device_batch_size_and_duration(traced: Traced) -> None:
    tracer, exporter = traced
    for step in range(3):
        with tracer.step(step, batch_size=32, device="cuda:3"):
            sum(range(20000 * (step + 1)))
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == [SPAN_NAME] * 3
    first = spans[0]
    assert first.attributes is not None
    assert first.attributes["vigil.train.step"] == 0
    assert first.attributes["vigil.train.batch_size"] == 32
    assert first.attributes["vigil.train.device"] == "cuda:3"
    assert first.attributes["vigil.job"] == "j7" and first.attributes["vigil.rank"] == 3
    assert first.status.status_code is StatusCode.OK
    for span in spans:
        assert span.end_time is not None and span.start_time is not None
        span_s = (span.end_time - span.start_time) / 1e9
        assert span.attributes is not None
        assert 0 < span.attributes["vigil.train.duration_s"] <= span_s + 1e-3


def test_exception_is_recorded_on_the_span_and_reraised(traced: Traced) -> None:
    tracer, exporter = traced
    with pytest.raises(RuntimeError, match="CUDA error: an illegal memory access"), \
            tracer.step(41, batch_size=16, device="cuda:0"):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    (event,) = [e for e in span.events if e.name == "exception"]
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "RuntimeError"
    assert "illegal memory access" in str(event.attributes["exception.message"])


def test_bad_step_arguments_are_rejected(traced: Traced) -> None:
    tracer, _ = traced
    with pytest.raises(VigilInputError, match="batch_size"), tracer.step(1, batch_size=-1, device="cpu"):
        pass


def test_batching_provider_delivers_to_its_exporter_with_the_service_name() -> None:
    exporter = InMemorySpanExporter()
    provider = otlp_provider(exporter, service_name="trainer-j7")
    tracer = StepTracer(provider=provider, rank=0)
    with tracer.step(0, batch_size=8, device="cpu"):
        pass
    assert provider.force_flush(timeout_millis=10_000)
    (span,) = exporter.get_finished_spans()
    assert span.resource.attributes["service.name"] == "trainer-j7"
    assert span.attributes is not None and "vigil.job" not in span.attributes
    provider.shutdown()


class Collector:
    """A bare OTLP/HTTP receiver: what an OpenTelemetry collector is sent, decoded with its protobuf."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, dict[str, object]]] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with collector.lock:
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            for span in scope.spans:
                                attrs = {a.key: _value(a.value) for a in span.attributes}
                                attrs["status"] = span.status.code
                                collector.spans.append((span.name, attrs))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(ExportTraceServiceResponse().SerializeToString())

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
def collector() -> Iterator[Collector]:
    receiver = Collector()
    try:
        yield receiver
    finally:
        receiver.close()


def test_probe_steps_reach_an_otlp_endpoint(collector: Collector, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.endpoint)
    traced = tracer_from_env("j7", 2)
    assert traced is not None
    probe = Probe(rank=2, world_size=4, out_dir=None)
    probe.step_tracer, provider = traced
    probe.note_batch(16, "cpu")
    probe.step()
    probe.step()
    try:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    except RuntimeError as err:
        probe.record_error(RuntimeError, err, err.__traceback__)
    assert provider.force_flush(timeout_millis=10_000)
    provider.shutdown()
    steps = sorted((attrs["vigil.train.step"], attrs) for name, attrs in collector.spans if name == SPAN_NAME)
    assert [step for step, _ in steps] == [1, 2, 3]
    first, second, failed = (attrs for _, attrs in steps)
    assert (first["vigil.train.batch_size"], first["vigil.train.device"], first["vigil.rank"]) == (16, "cpu", 2)
    assert "vigil.train.batch_size" not in second  # no forward seen in that step
    assert failed["status"] == 2  # STATUS_CODE_ERROR


def test_no_endpoint_no_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert tracer_from_env("j7", 0) is None


@pytest.mark.slow
def test_launched_job_exports_a_span_per_step_and_rank(collector: Collector, tmp_path: Path) -> None:
    job = Path(__file__).with_name("stack_job.py")
    diagnosis = launch(job, ["--stack", "ddp", "--steps", "5"], nproc=2, hang_timeout=10.0, out_dir=tmp_path,
                       env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.endpoint, "VIGIL_JOB": "otel-ddp"})
    assert diagnosis.verdict == "ok"
    spans = [attrs for name, attrs in collector.spans if name == SPAN_NAME]
    seen = sorted((a["vigil.rank"], a["vigil.train.step"]) for a in spans)
    assert seen == [(rank, step) for rank in (0, 1) for step in range(1, 6)]
    assert all(a["vigil.train.batch_size"] == 16 and a["vigil.job"] == "otel-ddp" for a in spans)
