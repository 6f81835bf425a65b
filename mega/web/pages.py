"""Rendering a page with the app's templates (one helper, typed, for framework and app)."""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response
from fastapi.templating import Jinja2Templates


def render(
    request: Request, template: str, context: dict[str, Any], *, status_code: int = 200
) -> Response:
    """Render `template` with `context`; the templates also see `csrf_token` and `user`."""
    templates: Jinja2Templates = request.app.state.templates
    return templates.TemplateResponse(request, template, context, status_code=status_code)
