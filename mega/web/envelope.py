"""The one JSON shape every /api response has, and the handlers that keep errors in it.

    {"ok": true,  "data": ..., "meta": {...}}
    {"ok": false, "error": {"code", "message", "fields"?}, "meta": {...}}

No handler ever returns a stack trace: unexpected exceptions are logged with their trace on the
server and answered with a 500 envelope that carries a request id to find that log line.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, Generic, Literal, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from nats import errors as nats_errors
from pydantic import BaseModel, ConfigDict
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from mega.errors import DependencyUnavailable, MegaError, WorkerError
from mega.web.fields import EMAIL_SENTENCE
from mega.web.pages import render

logger = logging.getLogger("mega.web")

# CPU pool failures as HTTP: a full queue asks the client to come back (with Retry-After).
WORKER_STATUS = {
    "worker.overloaded": 429,
    "worker.task_timeout": 504,
    "worker.crashed": 503,
    "worker.stopped": 503,
    "worker.invalid_args": 422,
    "worker.task_failed": 500,
    "worker.unknown_task": 500,
}

# nats-py errors that mean "the server is not there right now" (not a bad request).
NATS_UNAVAILABLE: tuple[type[Exception], ...] = (
    nats_errors.TimeoutError,
    nats_errors.NoServersError,
    nats_errors.ConnectionClosedError,
    nats_errors.StaleConnectionError,
    nats_errors.NoRespondersError,
    nats_errors.OutboundBufferLimitError,
)

STATUS_CODES = {
    400: "bad_request",
    401: "auth.required",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    422: "validation_failed",
    429: "rate_limited",
    500: "internal",
    503: "dependency.unavailable",
}


# -- the envelope as OpenAPI sees it (the routes build it with `ok` and `fail`) ----------------

T = TypeVar("T")


class Meta(BaseModel):
    """When the answer was made (epoch ms), and what else the route adds (request_id, ...)."""

    model_config = ConfigDict(extra="allow")
    ts: int


class Envelope(BaseModel, Generic[T]):
    """Every success answer of a JSON route."""

    ok: Literal[True]
    data: T
    meta: Meta


class ErrorDetail(BaseModel):
    code: str
    message: str
    fields: dict[str, str] | None = None  # field path -> what is wrong with it (422)


class ErrorEnvelope(BaseModel):
    """Every error answer of a JSON route."""

    ok: Literal[False]
    error: ErrorDetail
    meta: Meta


ERROR_DESCRIPTIONS = {
    401: "not logged in",
    403: "the CSRF token is missing or wrong",
    404: "no such thing",
    409: "refused in the current state (error.message says why)",
    422: "invalid input: error.fields names each bad field",
    429: "busy or rate-limited: come back after Retry-After seconds",
    500: "the task itself failed (error.message says how)",
    503: "a service it needs (NATS, Redis, the database, a pool) is unavailable",
    504: "the task ran past its timeout",
}


def api_responses(
    data: Any = None, *, status: int = 200, errors: Iterable[int] = ()
) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a JSON route for OpenAPI: the envelope of `data` at `status`, and
    the error envelope at each of `errors`.

    Args:
        data: the model or type of the envelope's `data`; None is any object.
        status: the status of the success answer.
        errors: the error statuses the route may answer, each one of 401, 403, 404, 409, 422,
            429, 500, 503 and 504 (KeyError for another).
    """
    success: Any = Envelope[data or dict[str, Any]]  # type: ignore[misc]  # chosen at run time
    documented: dict[int | str, dict[str, Any]] = {
        status: {"model": success, "description": "the envelope"}
    }
    for code in errors:
        documented[code] = {"model": ErrorEnvelope, "description": ERROR_DESCRIPTIONS[code]}
    return documented


class ApiError(Exception):
    """Raise from a route to answer with an error envelope."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        fields: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """The error answer this route gives, as `fail` builds it.

        Args:
            status: the HTTP status of the answer.
            code: the answer's `error.code`, a short stable name such as "not_found".
            message: the answer's `error.message`, a sentence for the person who reads it.
            fields: the answer's `error.fields`, what is wrong with each field by its path;
                None (or {}) leaves it out.
            headers: headers to add to the answer (a Retry-After, say); None adds none.
        """
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.fields, self.headers = fields, headers


def ok(data: Any, status: int = 200, **meta: Any) -> JSONResponse:
    """A success answer in the envelope: ``{"ok": true, "data": ..., "meta": {...}}``.

    Args:
        data: the answer's `data`, any value JSON can hold.
        status: the HTTP status.
        **meta: added to `meta`, besides `ts` (epoch ms): a `request_id`, say.
    """
    return JSONResponse({"ok": True, "data": data, "meta": _meta(meta)}, status_code=status)


def fail(
    status: int,
    code: str,
    message: str,
    *,
    fields: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    **meta: Any,
) -> JSONResponse:
    """An error answer in the envelope: ``{"ok": false, "error": {...}, "meta": {...}}``.

    Args:
        status: the HTTP status of the answer.
        code: the answer's `error.code`, a short stable name such as "not_found".
        message: the answer's `error.message`, a sentence for the person who reads it.
        fields: the answer's `error.fields`, what is wrong with each field by its path; None
            (or {}) leaves it out.
        headers: headers to add to the answer (a Retry-After, say); None adds none.
        **meta: added to `meta`, besides `ts` (epoch ms): a `request_id`, say.
    """
    error: dict[str, Any] = {"code": code, "message": message}
    if fields:
        error["fields"] = fields
    body = {"ok": False, "error": error, "meta": _meta(meta)}
    return JSONResponse(body, status_code=status, headers=headers)


# What FastAPI raises (as a 400) when `json.loads` fails with anything but a JSONDecodeError:
# bytes that are not UTF-8, or nesting past the parser's recursion limit.
BODY_PARSE_ERROR = "There was an error parsing the body"


def _meta(extra: dict[str, Any]) -> dict[str, Any]:
    return {"ts": int(time.time() * 1000), **extra}


def wants_json(request: Request) -> bool:
    """API routes and fetch() calls get envelopes; page navigations get HTML or redirects."""
    return request.url.path.startswith("/api/") or "application/json" in request.headers.get(
        "accept", ""
    )


def field_errors(errors: Sequence[Any]) -> dict[str, str]:
    """Pydantic's error list as {"field.path": "plain sentence"} (the first one per field).
    Fields declared with `WholeNumber` or `EmailAddress` (mega.web.fields) word every error as
    one sentence that names what is allowed; an error of the whole model is keyed "body".

    Args:
        errors: pydantic's errors, as `ValidationError.errors()` (or FastAPI's
            `RequestValidationError.errors()`) gives them.
    """
    fields: dict[str, str] = {}
    for err in errors:
        loc = [str(part) for part in err.get("loc", ()) if part not in ("body", "query", "form")]
        fields.setdefault(".".join(loc) or "body", friendly_message(err))
    return fields


def friendly_message(err: Any) -> str:
    """One pydantic error as a sentence a person filling in a form understands: "must be a
    whole number", "must be at most 60000", not "Input should be a valid integer, unable to
    parse string as an integer". Types it does not know keep pydantic's own text."""
    kind, ctx = str(err.get("type", "")), err.get("ctx") or {}
    if kind in _PLAIN:
        return _PLAIN[kind]
    if kind in _BOUNDS:
        return _BOUNDS[kind].format(**ctx)
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', 'the listed values')}"
    if kind == "string_pattern_mismatch":
        return "has characters that are not allowed here"
    if kind == "value_error":  # our own validators' and email-validator's sentences
        message = str(ctx.get("error") or err.get("msg", "is invalid")).removeprefix(
            "Value error, "
        )
        # email-validator's reason is for mail programmers; say what an address looks like.
        return EMAIL_SENTENCE if message.startswith(_NOT_AN_ADDRESS) else message
    return str(err.get("msg", "is invalid"))


_NOT_AN_ADDRESS = "value is not a valid email address: "
_PLAIN = {
    "missing": "is required",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be text",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "list_type": "must be a list",
    "extra_forbidden": "is not a field this accepts",
    "json_invalid": "is not valid JSON",
    "url_parsing": "must be a URL",
}
_BOUNDS = {
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "string_too_short": "must be at least {min_length} characters",
    "string_too_long": "must be at most {max_length} characters",
    "too_short": "must have at least {min_length} items",
    "too_long": "must have at most {max_length} items",
}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return fail(exc.status, exc.code, exc.message, fields=exc.fields, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, exc: RequestValidationError) -> Response:
        return fail(
            422, "validation_failed", "some fields are invalid", fields=field_errors(exc.errors())
        )

    @app.exception_handler(DependencyUnavailable)
    async def unavailable(request: Request, exc: DependencyUnavailable) -> Response:
        logger.warning("%s %s: %s", request.method, request.url.path, exc.message)
        if not wants_json(request):
            return _html_error(request, 503, "A service is unavailable", exc.message)
        return fail(503, exc.code, exc.message, dependency=exc.dependency)

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def redis_down(request: Request, exc: Exception) -> Response:
        return await unavailable(
            request, DependencyUnavailable("redis", f"Redis is unavailable: {exc}")
        )

    async def nats_down(request: Request, exc: Exception) -> Response:
        reason = str(exc) or type(exc).__name__
        return await unavailable(
            request, DependencyUnavailable("nats", f"NATS is unavailable: {reason}")
        )

    for nats_error in NATS_UNAVAILABLE:
        app.add_exception_handler(nats_error, nats_down)

    @app.exception_handler(WorkerError)
    async def worker_error(request: Request, exc: WorkerError) -> Response:
        status = WORKER_STATUS.get(exc.code, 500)
        retry_after = getattr(exc, "retry_after_s", None)
        headers = {"Retry-After": str(retry_after)} if retry_after else None
        return fail(status, exc.code, exc.message, headers=headers)

    @app.exception_handler(MegaError)
    async def mega_error(request: Request, exc: MegaError) -> Response:
        status = 413 if exc.code.endswith(".payload_too_large") else 400
        return fail(status, exc.code, exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.detail == BODY_PARSE_ERROR:
            # A body JSON could not even read (invalid UTF-8, nested too deep): bad input like
            # any other, so a 422 with the field, not FastAPI's bare 400.
            return fail(
                422,
                "validation_failed",
                "some fields are invalid",
                fields={
                    "body": "not valid JSON: it must be UTF-8 text, nested a few hundred "
                    "levels at most"
                },
            )
        if exc.status_code == 401 and not wants_json(request):
            return RedirectResponse(login_url(request), status_code=303)
        if not wants_json(request) and exc.status_code == 404:
            return _html_error(request, 404, "Not found", "There is no page at this address.")
        if not wants_json(request) and exc.status_code == 403:
            return _html_error(request, 403, "Not allowed", str(exc.detail))
        code = STATUS_CODES.get(exc.status_code, "http_error")
        fields = {"body": str(exc.detail)} if exc.status_code == 422 else None
        return fail(
            exc.status_code, code, str(exc.detail), fields=fields, headers=dict(exc.headers or {})
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        request_id = uuid.uuid4().hex[:12]
        logger.exception("unhandled error (request %s) on %s", request_id, request.url.path)
        message = f"internal error; the server log has the details (request {request_id})"
        if wants_json(request):
            return fail(500, "internal", message, request_id=request_id)
        return _html_error(request, 500, "Something went wrong", message)


def login_url(request: Request) -> str:
    from urllib.parse import quote

    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return f"/login?next={quote(target, safe='/')}"


def _html_error(request: Request, status: int, title: str, message: str) -> Response:
    return render(request, "error.html", {"title": title, "message": message}, status_code=status)
