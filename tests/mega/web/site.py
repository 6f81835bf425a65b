"""A minimal application on the framework alone, for the framework's own tests: the bare
`create_web_app` with one page and one JSON resource behind the login, one public route (no
login: a webhook), and no templates of its own (the framework's fallback templates render the
login page)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import BaseModel, StringConstraints

from mega import Config, Context
from mega.web import UserDep, create_web_app, flash, ok, render

router = APIRouter()
public = APIRouter()


class Thing(BaseModel):
    name: Annotated[str, StringConstraints(min_length=1, max_length=100)]


@router.get("/home")
async def home(request: Request, user: UserDep) -> Response:
    return render(request, "base.html", {"title": "Home"})


@router.post("/home/note")
async def note(request: Request, user: UserDep) -> Response:
    """Post, redirect, get: the page after the redirect says it once."""
    return flash(request, RedirectResponse("/home", status_code=303), "Noted <b>once</b>.")


@router.get("/api/things")
async def list_things(request: Request, user: UserDep) -> Response:
    return ok({"things": request.app.state.things})


@router.post("/api/things")
async def add_thing(body: Thing, request: Request, user: UserDep) -> Response:
    request.app.state.things.append(body.name)
    return ok({"name": body.name}, status=201)


@public.post("/api/hooks/{source}")
async def hook(source: str, body: Thing, request: Request) -> Response:
    """A webhook: another service posts here with no login and no CSRF token."""
    return ok({"from": source, "pong": body.name})


def create_app(config: Config, ctx: Context) -> FastAPI:
    app = create_web_app(config, ctx, routers=[router], public_routers=[public], title="site")
    app.state.things = []
    return app
