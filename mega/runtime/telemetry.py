"""The OpenTelemetry SDK of a host, set up from the standard OTEL_* environment variables.

    OTEL_TRACES_EXPORTER=console mega worker     # each span, one JSON line on stdout
    OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 mega start

Only when OTEL_TRACES_EXPORTER names an exporter, the SDK is installed (`pip install
opentelemetry-sdk`, and `opentelemetry-exporter-otlp` for otlp) and nothing in the process set
a tracer provider already (`opentelemetry-instrument` or the application's own code wins).
The service is named by OTEL_SERVICE_NAME, else `mega-<host>` (mega-worker, mega-web...).
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger("mega.tracing")


def setup_tracing(host: str) -> bool:
    """Set up the SDK for this host when OTEL_TRACES_EXPORTER asks for it (see the module);
    True when it did. A missing package is one line naming what to install, never a crash."""
    names = [
        name.strip()
        for name in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")
        if name.strip() and name.strip() != "none"
    ]
    if not names:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning(
            "OTEL_TRACES_EXPORTER=%s but the OpenTelemetry SDK is not installed: no traces "
            "(pip install opentelemetry-sdk)",
            ",".join(names),
        )
        return False
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # set up already, by opentelemetry-instrument or the application
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": f"mega-{host}"}
    provider = TracerProvider(resource=Resource.create(attributes))
    exporters = [exporter for name in names if (exporter := _exporter(name)) is not None]
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if not exporters:
        return False
    trace.set_tracer_provider(provider)
    logger.info(
        "traces: %s, service %s", ",".join(names), provider.resource.attributes.get("service.name")
    )
    return True


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(formatter=lambda span: span.to_json(indent=None) + "\n")
    if name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            logger.warning(
                "OTEL_TRACES_EXPORTER=otlp needs the OTLP exporter: pip install "
                "opentelemetry-exporter-otlp-proto-http"
            )
            return None
        return OTLPSpanExporter()
    logger.warning("OTEL_TRACES_EXPORTER: unknown exporter %r (console, otlp or none)", name)
    return None
