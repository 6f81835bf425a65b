"""mega.web: the FastAPI side of the framework, for applications that serve pages and JSON.

    from mega.web import create_web_app, UserDep, ok, render

    @router.get("/api/things")
    async def things(request: Request, user: UserDep) -> Response:   # 401 when anonymous
        return ok({"things": [...]})                                  # the JSON envelope

`CtxDep`, `queue_dep(bus)`, `pool_dep(name)` and `provided(cls)` give a route the context, a
JobQueue, a CPU pool and the app's own objects (mega/web/deps.py).

`admin_router(prefix="/admin")` is the operator's pages over the whole fleet (mega/web/admin).

`create_web_app(config, ctx, routers=[...])` wires login, sessions, CSRF, security headers, the
envelope, /healthz, /readyz and /metrics; see the guide's http chapter.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mega.web.accounts import ensure_user
    from mega.web.admin import (
        admin_router,
        instance_rows,
        scheduler_instances,
        short_instance,
        tick_rows,
    )
    from mega.web.app import create_web_app
    from mega.web.auth import AdminDep, CurrentUser, OperatorDep, UserDep, audited
    from mega.web.deps import CtxDep, context, job_queue, pool_dep, provide, provided, queue_dep
    from mega.web.envelope import ApiError, api_responses, fail, field_errors, ok
    from mega.web.fields import EmailAddress, WholeNumber, form_number
    from mega.web.limits import normalise_username
    from mega.web.pages import flash, render

# Each name is imported from its module on first use (PEP 562): a command that needs one
# module of this package, such as `mega token` its tokens table, does not import FastAPI
# and every page with it.
_MODULES = {
    "AdminDep": "mega.web.auth",
    "ApiError": "mega.web.envelope",
    "CtxDep": "mega.web.deps",
    "CurrentUser": "mega.web.auth",
    "EmailAddress": "mega.web.fields",
    "OperatorDep": "mega.web.auth",
    "UserDep": "mega.web.auth",
    "WholeNumber": "mega.web.fields",
    "admin_router": "mega.web.admin",
    "api_responses": "mega.web.envelope",
    "audited": "mega.web.auth",
    "context": "mega.web.deps",
    "create_web_app": "mega.web.app",
    "ensure_user": "mega.web.accounts",
    "fail": "mega.web.envelope",
    "field_errors": "mega.web.envelope",
    "flash": "mega.web.pages",
    "form_number": "mega.web.fields",
    "instance_rows": "mega.web.admin",
    "job_queue": "mega.web.deps",
    "normalise_username": "mega.web.limits",
    "ok": "mega.web.envelope",
    "pool_dep": "mega.web.deps",
    "provide": "mega.web.deps",
    "provided": "mega.web.deps",
    "queue_dep": "mega.web.deps",
    "render": "mega.web.pages",
    "scheduler_instances": "mega.web.admin",
    "short_instance": "mega.web.admin",
    "tick_rows": "mega.web.admin",
}

__all__ = [
    "AdminDep",
    "ApiError",
    "CtxDep",
    "CurrentUser",
    "EmailAddress",
    "OperatorDep",
    "UserDep",
    "WholeNumber",
    "admin_router",
    "api_responses",
    "audited",
    "context",
    "create_web_app",
    "ensure_user",
    "fail",
    "field_errors",
    "flash",
    "form_number",
    "instance_rows",
    "job_queue",
    "normalise_username",
    "ok",
    "pool_dep",
    "provide",
    "provided",
    "queue_dep",
    "render",
    "scheduler_instances",
    "short_instance",
    "tick_rows",
]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'mega.web' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # once: the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULES])
