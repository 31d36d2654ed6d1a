"""Train-step spans through the real OTel SDK, captured by its in-memory exporter."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from vigil.model import VigilInputError
from vigil.sources.probe.otel import SPAN_NAME, StepTracer, otlp_provider

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
