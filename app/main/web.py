"""The sample's web app: the framework's app plus the demo pages and their JSON routes."""

from __future__ import annotations

from fastapi import FastAPI

from app.main.routes import pages
from app.mega import Config, Context
from app.mega.web.app import create_web_app


def create_app(config: Config, ctx: Context) -> FastAPI:
    return create_web_app(config, ctx, routers=[pages.router], title="mega-py demo")
