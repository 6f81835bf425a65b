"""What one traced run's span costs, in a process of its own (bench_jobs runs it): the
OpenTelemetry SDK's own span (started with the same name, kind and attributes, made current,
ended) against mega's `tracing.processing` around a run, both behind the batch processor and
the exporter that drops spans which the traced worker uses. It prints
{"sdk_us": ..., "mega_us": ...}, the best of a few rounds of each, alternated.

    python -m bench.span_cost
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

ROUNDS = 5
SPANS = 20_000


def _per_span_us(spans: Callable[[], None]) -> float:
    started = time.perf_counter()
    for _ in range(SPANS):
        spans()
    return (time.perf_counter() - started) / SPANS * 1e6


def main() -> dict[str, float]:
    from bench.jobs_noop import _start_tracing

    _start_tracing(1.0)
    from opentelemetry import context, trace

    from mega import tracing

    sdk_tracer = trace.get_tracer("bench")
    attributes = {
        "messaging.system": "nats",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "bench.noop",
        "messaging.message.id": "5b3d7263ae304343a399b0445d5626ee",
        "mega.attempt": 1,
    }

    def sdk() -> None:
        span = sdk_tracer.start_span(
            "process bench.noop", kind=trace.SpanKind.CONSUMER, attributes=attributes
        )
        token = context.attach(trace.set_span_in_context(span))
        context.detach(token)
        span.end()

    def mega() -> None:
        with tracing.processing(
            "bench.noop",
            system="nats",
            message_id="5b3d7263ae304343a399b0445d5626ee",
            attempt=1,
            headers=None,
        ):
            pass

    best = {"sdk_us": float("inf"), "mega_us": float("inf")}
    for _ in range(ROUNDS):
        best["sdk_us"] = min(best["sdk_us"], _per_span_us(sdk))
        best["mega_us"] = min(best["mega_us"], _per_span_us(mega))
    return best


if __name__ == "__main__":
    print(json.dumps(main()))
