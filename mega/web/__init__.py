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

from mega.web.admin import (
    admin_router,
    instance_rows,
    scheduler_instances,
    short_instance,
    tick_rows,
)
from mega.web.app import create_web_app
from mega.web.auth import AdminDep, CurrentUser, OperatorDep, UserDep, audited, ensure_user
from mega.web.deps import CtxDep, context, job_queue, pool_dep, provide, provided, queue_dep
from mega.web.envelope import ApiError, api_responses, fail, field_errors, ok
from mega.web.fields import EmailAddress, WholeNumber, form_number
from mega.web.limits import normalise_username
from mega.web.pages import flash, render

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
