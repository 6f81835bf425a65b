"""mega.web: the FastAPI side of the framework, for applications that serve pages and JSON.

    from mega.web import create_web_app, UserDep, ok, render

    @router.get("/api/things")
    async def things(request: Request, user: UserDep) -> Response:   # 401 when anonymous
        return ok({"things": [...]})                                  # the JSON envelope

`create_web_app(config, ctx, routers=[...])` wires login, sessions, CSRF, security headers, the
envelope, /healthz, /readyz and /metrics; see the guide's http chapter.
"""

from mega.web.app import create_web_app
from mega.web.auth import CurrentUser, UserDep, ensure_user
from mega.web.envelope import ApiError, api_responses, fail, field_errors, ok
from mega.web.fields import EmailAddress, WholeNumber, form_number
from mega.web.limits import normalise_username
from mega.web.pages import flash, render

__all__ = [
    "ApiError",
    "CurrentUser",
    "EmailAddress",
    "UserDep",
    "WholeNumber",
    "api_responses",
    "create_web_app",
    "ensure_user",
    "fail",
    "field_errors",
    "flash",
    "form_number",
    "normalise_username",
    "ok",
    "render",
]
