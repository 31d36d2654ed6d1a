"""OpenTelemetry train-step spans: one span per training step with device, batch size, duration, exception.

Uses only the OTel API and SDK (opentelemetry-api / -sdk). Where the spans go is the tracer provider's
business: in tests an InMemorySpanExporter; in production an OTLP exporter pointed at a collector
(docs/server.md, "OpenTelemetry"), e.g. with ``OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector:4317``
and ``pip install opentelemetry-exporter-otlp`` in the training image:

    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    tracer = StepTracer(provider=otlp_provider(OTLPSpanExporter()), job="j7", rank=3)
    for step, batch in enumerate(loader):
        with tracer.step(step, batch_size=len(batch), device="cuda:3"):
            train_step(batch)

The probe records these spans itself when an endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, OTLP over HTTP/protobuf): one span per optimizer step, from the
previous step's end (or the probe's start) to this one's, with the batch size and device of the step's
first forward; an uncaught exception ends the open step's span with status ERROR.

Attribute names: ``vigil.train.step``, ``vigil.train.batch_size``, ``vigil.train.device`` (e.g. cuda:3),
``vigil.job``, ``vigil.rank`` and, on failure, the span's recorded exception event with status ERROR. The
span's own start/end give the duration; ``vigil.train.duration_s`` repeats it so a backend that only
indexes attributes can still aggregate it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, Status, StatusCode

from vigil import __version__
from vigil.model import VigilInputError

SPAN_NAME = "train_step"


def otlp_provider(exporter: SpanExporter, service_name: str = "vigil-train") -> TracerProvider:
    """A tracer provider that batches spans to ``exporter`` (an OTLP exporter in production)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class StepTracer:
    """Wraps each training step in a span; an exception is recorded on the span and re-raised."""

    def __init__(self, provider: trace.TracerProvider | None = None, job: str | None = None,
                 rank: int | None = None) -> None:
        tracer_provider = provider if provider is not None else trace.get_tracer_provider()
        self.tracer = tracer_provider.get_tracer("vigil.sources.probe", __version__)
        self.job = job
        self.rank = rank

    @contextmanager
    def step(self, step: int, batch_size: int, device: str) -> Iterator[Span]:
        if step < 0 or batch_size < 0:
            raise VigilInputError(f"train step: step ({step}) and batch_size ({batch_size}) must be >= 0")
        attributes: dict[str, str | int] = {
            "vigil.train.step": step,
            "vigil.train.batch_size": batch_size,
            "vigil.train.device": device,
        }
        if self.job is not None:
            attributes["vigil.job"] = self.job
        if self.rank is not None:
            attributes["vigil.rank"] = self.rank
        # The span records the exception itself (with its type and stack) and sets status ERROR.
        with self.tracer.start_as_current_span(SPAN_NAME, attributes=attributes, record_exception=True,
                                               set_status_on_exception=True) as span:
            started = time.perf_counter()
            try:
                yield span
            finally:
                span.set_attribute("vigil.train.duration_s", time.perf_counter() - started)
            span.set_status(Status(StatusCode.OK))

    def record(self, step: int, start: float, end: float, batch_size: int | None, device: str | None,
               error: BaseException | None = None) -> None:
        """A step that already happened (wall-clock seconds), as the probe sees it: after the fact."""
        attributes: dict[str, str | int | float] = {"vigil.train.step": step, "vigil.train.duration_s": end - start}
        if batch_size is not None:
            attributes["vigil.train.batch_size"] = batch_size
        if device is not None:
            attributes["vigil.train.device"] = device
        if self.job is not None:
            attributes["vigil.job"] = self.job
        if self.rank is not None:
            attributes["vigil.rank"] = self.rank
        span = self.tracer.start_span(SPAN_NAME, start_time=int(start * 1e9), attributes=attributes)
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        else:
            span.set_status(Status(StatusCode.OK))
        span.end(end_time=int(end * 1e9))


ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def tracer_from_env(job: str | None, rank: int) -> tuple[StepTracer, TracerProvider] | None:
    """A step tracer exporting over OTLP/HTTP when an endpoint is configured; None otherwise."""
    if not any(os.environ.get(name) for name in ENDPOINT_VARS):
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        sys.stderr.write("vigil probe: an OTLP endpoint is set but opentelemetry-exporter-otlp-proto-http "
                         "is not installed; no step spans\n")
        return None
    # The exporter reads the endpoint, headers and timeout from the standard OTEL_* variables.
    provider = otlp_provider(OTLPSpanExporter())
    return StepTracer(provider=provider, job=job, rank=rank), provider
