"""Traces: OpenTelemetry spans for what the framework does, with the trace context in the messages.

    pip install 'mega-py[otel]' opentelemetry-sdk      # the SDK and exporters are yours
    OTEL_TRACES_EXPORTER=console mega worker            # the hosts set up the SDK from OTEL_*

One trace follows a request through `enqueue` to each attempt of the job, and through
`outbox.add`, the relay's publish and each listener group's run to the jobs they enqueue. A tick
and a pool task are spans too. Names and attributes follow OpenTelemetry's messaging
conventions: `send <subject>` (producer) when a job is stored, `publish <event>` when an event
is, `process <subject>` (consumer) for each run, its parent the span that stored the message.

The context travels in each message as `Message.trace` / `Delivery.trace`: the headers the
configured propagator writes (W3C `traceparent` and `tracestate` by default), kept by every
driver. A retry's copy also carries `mega-previous`, the failed attempt's context, and the next
attempt links to it. (A redelivery after a worker died has no such link: that attempt's span
never ended, so it was never exported; the job's status history names its worker.)

No cost without an SDK: `tracer()` is None until an SDK's tracer provider is set, and then
nothing here opens a span or writes a header. The API is not even imported until something else
has (whoever sets a provider imports it first), so a host without tracing starts as fast.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

# The headers of the trace context a message may carry (what the W3C propagator writes, and
# the baggage one), and the one a retry's copy adds: the context of the attempt that failed.
CARRIED = ("traceparent", "tracestate", "baggage")
PREVIOUS = "mega-previous"

# `messaging.system` of each driver (OpenTelemetry's well-known values where there is one).
SYSTEMS = {"nats": "nats", "redis": "redis", "postgres": "postgresql", "memory": "memory"}

_cache: tuple[object, Tracer | None] = (None, None)


class _Api:
    """The OpenTelemetry names this module uses, imported once an SDK is found (an import
    statement in a function costs a look-up at every call: these run for every job)."""

    def __init__(self) -> None:
        from opentelemetry import context, propagate
        from opentelemetry.trace import (
            Link,
            NonRecordingSpan,
            SpanContext,
            SpanKind,
            Status,
            StatusCode,
            TraceFlags,
            get_current_span,
            set_span_in_context,
        )

        self.attach, self.detach = context.attach, context.detach
        self.inject, self.extract = propagate.inject, propagate.extract
        self.Link, self.NonRecordingSpan, self.SpanContext = Link, NonRecordingSpan, SpanContext
        self.CONSUMER, self.PRODUCER = SpanKind.CONSUMER, SpanKind.PRODUCER
        self.Status, self.ERROR, self.TraceFlags = Status, StatusCode.ERROR, TraceFlags
        self.get_current_span, self.set_span_in_context = get_current_span, set_span_in_context


_api: Any = None


def tracer() -> Tracer | None:
    """The framework's tracer when an OpenTelemetry SDK is set up in this process, else None."""
    global _cache
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return None
    provider = api.get_tracer_provider()
    if provider is _cache[0]:
        return _cache[1]
    found = None
    if not isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider)):
        found = provider.get_tracer("mega")
        _load_api()
    _cache = (provider, found)
    return found


def _load_api() -> None:
    global _api
    if _api is None:
        _api = _Api()


def carrier() -> dict[str, str] | None:
    """The current span's context as message headers (None when there is no span)."""
    _load_api()
    headers: dict[str, str] = {}
    _api.inject(headers)
    return headers or None


def _context(headers: Mapping[str, str] | None) -> Any:
    """The context a message's headers carry. A lone W3C `traceparent` (what mega writes with
    the default propagators) is read here, three times faster than the propagators' extract,
    which reads anything else."""
    _load_api()
    if headers and len(headers) == 1 and "traceparent" in headers:
        parent = _parent(headers["traceparent"])
        if parent is not None:
            return parent
    return _api.extract(dict(headers) if headers else {})


def _parent(traceparent: str) -> Any:
    """The context of a version-00 `traceparent` (None when it is not one)."""
    parts = traceparent.split("-")
    if len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    context = _api.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=_api.TraceFlags(flags)
    )
    return _api.set_span_in_context(_api.NonRecordingSpan(context))


def _attributes(
    system: str, operation: str, kind: str, destination: str, **more: Any
) -> dict[str, Any]:
    attributes = {
        "messaging.system": SYSTEMS.get(system, system),
        "messaging.operation.type": kind,
        "messaging.operation.name": operation,
        "messaging.destination.name": destination,
    }
    attributes.update((key, value) for key, value in more.items() if value is not None)
    return attributes


@contextlib.contextmanager
def producing(
    operation: str,
    destination: str,
    *,
    system: str,
    ids: list[str],
    parent: Mapping[str, str] | None = None,
    kind: str = "send",
) -> Iterator[dict[str, str] | None]:
    """A producer span `<operation> <destination>` around storing messages (`ids`); yields
    the headers that carry it (None without an SDK). `parent`: the headers of the context it
    continues (an outbox row's), else the current one."""
    found = tracer()
    if found is None:
        yield None
        return
    attributes = _attributes(system, operation, kind, destination)
    if len(ids) == 1:
        attributes["messaging.message.id"] = ids[0]
    else:
        attributes["messaging.batch.message_count"] = len(ids)
    context = _context(parent) if parent is not None else None
    with found.start_as_current_span(
        f"{operation} {destination}",
        context=context,
        kind=_api.PRODUCER,
        attributes=attributes,
    ):
        yield carrier()


@contextlib.contextmanager
def producing_each(
    operation: str,
    messages: Sequence[tuple[str, str, Mapping[str, str] | None]],
    *,
    system: str,
    kind: str = "publish",
) -> Iterator[list[dict[str, str] | None]]:
    """A producer span per message (destination, id, the headers of the context it continues,
    as an outbox row stored them) around storing them in one batch; yields each one's headers
    (all None without an SDK). They end together, as errors if the batch raised."""
    found = tracer()
    if found is None:
        yield [None] * len(messages)
        return
    spans = []
    headers: list[dict[str, str] | None] = []
    for destination, message_id, parent in messages:
        span = found.start_span(
            f"{operation} {destination}",
            context=_context(parent),
            kind=_api.PRODUCER,
            attributes=_attributes(
                system, operation, kind, destination, **{"messaging.message.id": message_id}
            ),
        )
        carried_by: dict[str, str] = {}
        _api.inject(carried_by, context=_api.set_span_in_context(span))
        spans.append(span)
        headers.append(carried_by or None)
    try:
        yield headers
    except BaseException as exc:
        for span in spans:
            _failed(span, exc)
        raise
    finally:
        for span in spans:
            span.end()


class processing:  # lower case: used as a function, `with processing(...):`
    """A consumer span `process <destination>` around one attempt, current while it runs:
    its parent is the context the message carries, and it links to the attempt before when a
    retry's copy names it. An exception ends it as an error (and goes on). Without an SDK it
    does nothing. (A class, not a generator: it runs for every job a traced worker runs.)"""

    __slots__ = ("_span", "_token")

    def __init__(
        self,
        destination: str,
        *,
        system: str,
        message_id: str,
        attempt: int,
        headers: Mapping[str, str] | None,
        group: str | None = None,
    ) -> None:
        self._span: Any = None
        self._token: Any = None
        found = tracer()
        if found is None:
            return
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEMS.get(system, system),
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": destination,
            "messaging.message.id": message_id,
            "mega.attempt": attempt,
        }
        if group is not None:
            attributes["messaging.consumer.group.name"] = group
        links = None
        if headers and PREVIOUS in headers:
            before = _api.get_current_span(_context({"traceparent": headers[PREVIOUS]}))
            links = [_api.Link(before.get_span_context(), {"mega.attempt": attempt - 1})]
        self._span = found.start_span(
            f"process {destination}",
            context=_context(headers) if headers else None,
            kind=_api.CONSUMER,
            attributes=attributes,
            links=links,
        )

    def __enter__(self) -> Span | None:
        if self._span is not None:
            self._token = _api.attach(_api.set_span_in_context(self._span))
        return self._span  # type: ignore[no-any-return]

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> None:
        span = self._span
        if span is None:
            return
        _api.detach(self._token)
        if exc is not None:
            _failed(span, exc)
        span.end()


@contextlib.contextmanager
def internal(name: str, **attributes: Any) -> Iterator[Span | None]:
    """An internal span `name` under the current one (a tick, a pool task)."""
    found = tracer()
    if found is None:
        yield None
        return
    clean = {key: value for key, value in attributes.items() if value is not None}
    with found.start_as_current_span(name, attributes=clean) as span:
        yield span


def retried(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    """The trace headers of a retry's copy: the message's own, and the context of the
    current span (the attempt that failed) as `mega-previous`, for the next one to link to."""
    if tracer() is None:
        return dict(headers) if headers else None
    current = carrier()
    if current is None or "traceparent" not in current:
        return dict(headers) if headers else None
    return {**(headers or {}), PREVIOUS: current["traceparent"]}


def failed(exc: BaseException) -> None:
    """End the current span as an error, with `exc` recorded (nothing without an SDK)."""
    if tracer() is None:
        return
    _failed(_api.get_current_span(), exc)


def _failed(span: Any, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(_api.Status(_api.ERROR, f"{type(exc).__name__}: {exc}"[:200]))


def ids() -> tuple[str, str] | None:
    """The current span's trace id and span id (hex), for a log line; None outside a span."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return None
    context = api.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def carried(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The trace headers among a message's headers (None when it has none)."""
    found = {key: headers[key] for key in (*CARRIED, PREVIOUS) if key in headers}
    return found or None
