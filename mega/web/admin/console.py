"""The admin pages' state (mega/web/admin/routes.py): `Admin`, what every page and action of one
`admin_router` shares (its prefix and URLs, the lanes and scheduler it shows, the page
renderer), and `Lane`, one job queue or listener group as the pages show it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import Form, HTTPException, Query, Request, Response
from fastapi.responses import RedirectResponse

from mega.errors import ConfigError, RegistrationError
from mega.events.bus import EventBus
from mega.jobs.queue import JobQueue
from mega.lanes.dlq import DeadLetters
from mega.schedules.scheduler import Scheduler
from mega.web.admin import fleet
from mega.web.deps import context, job_queue, provide, provided
from mega.web.pages import flash, render

PAGE_SIZE = 50
MAX_ID_CHARS = 200
STYLESHEET = fleet.__file__.rsplit("/", 1)[0] + "/admin.css"

IdQuery = Annotated[str, Query(max_length=MAX_ID_CHARS)]
BeforeQuery = Annotated[int | None, Query(ge=1)]
IdForm = Annotated[str, Form(min_length=1, max_length=MAX_ID_CHARS)]


@dataclass
class Lane:
    """A registered job or listener class, with the endpoint that reads its lane."""

    kind: str  # "job" or "group"
    name: str
    cls: type[Any]
    endpoint: JobQueue | EventBus

    @property
    def bus(self) -> str:
        return self.endpoint.bus_alias

    @property
    def dlq(self) -> DeadLetters:
        return self.endpoint.dlq


@dataclass
class AdminState:
    """What the admin keeps per app: the rate samples and the event buses it made."""

    rates: fleet.RateSampler = field(default_factory=fleet.RateSampler)
    event_buses: dict[str, EventBus] = field(default_factory=dict)


class Admin:
    """The router's settings and the lookups its routes share."""

    def __init__(
        self,
        prefix: str,
        jobs: Sequence[type[Any]] | None,
        listeners: Sequence[type[Any]] | None,
        schedules: Sequence[type[Any]] | None,
        title: str,
    ) -> None:
        self.prefix = prefix.rstrip("/")
        self.jobs, self.listeners, self.schedules = jobs, listeners, schedules
        self.title = title

    # -- urls ------------------------------------------------------------------------------

    def url(self, path: str = "/", **query: Any) -> str:
        kept = {k: v for k, v in query.items() if v is not None}
        return self.prefix + path + (f"?{urlencode(kept)}" if kept else "")

    def job_url(self, job_id: str, job: str | None = None) -> str:
        return self.url(f"/jobs/{quote(job_id, safe='')}", job=job)

    def workflow_url(self, workflow_id: str) -> str:
        return self.url(f"/workflows/{quote(workflow_id, safe='')}")

    def dlq_url(self, lane: Lane, **query: Any) -> str:
        name = quote(lane.name, safe="")
        path = f"/dlq/{name}" if lane.kind == "job" else f"/listeners/{name}/dlq"
        return self.url(path, **query)

    # -- the registry ------------------------------------------------------------------------

    def state(self, request: Request) -> AdminState:
        app_state = request.app.state
        if not hasattr(app_state, "mega_admin"):
            app_state.mega_admin = AdminState()
        kept: AdminState = app_state.mega_admin
        return kept

    def job_lanes(self, request: Request) -> list[Lane]:
        config = request.app.state.config
        lanes = []
        for cls in self.jobs if self.jobs is not None else config.jobs:
            queue = job_queue(request.app, cls.bus)
            lanes.append(Lane("job", queue.spec(cls).name, cls, queue))
        return lanes

    def group_lanes(self, request: Request) -> list[Lane]:
        config = request.app.state.config
        buses = self.state(request).event_buses
        lanes = []
        for cls in self.listeners if self.listeners is not None else config.listeners:
            alias = cls.bus or getattr(cls.event, "bus", None)
            if alias is None:
                raise ConfigError(f"{cls.__name__}: a listener of a pattern needs `bus`")
            if alias not in buses:
                buses[alias] = EventBus(context(request), alias)
            lanes.append(Lane("group", buses[alias].spec(cls).group, cls, buses[alias]))
        return lanes

    def lane(self, request: Request, kind: str, name: str) -> Lane:
        lanes = self.job_lanes(request) if kind == "job" else self.group_lanes(request)
        for lane in lanes:
            if lane.name == name:
                return lane
        what = "job queue" if kind == "job" else "listener group"
        raise HTTPException(404, f"no {what} named {name!r} is registered")

    def scheduler(self, request: Request) -> Scheduler:
        """The app's Scheduler when it provided one, else one made here (never started: the
        web app only reads the audit, pauses, resumes and runs manual ticks)."""
        try:
            scheduler = provided(Scheduler)(request)
        except ConfigError:
            scheduler = Scheduler(context(request))
            provide(request.app, scheduler)
        config = request.app.state.config
        for cls in self.schedules if self.schedules is not None else config.schedules:
            if getattr(cls, "name", None) not in scheduler.names:
                with contextlib.suppress(RegistrationError):  # registered under its name
                    scheduler.register(cls)
        return scheduler

    def page(
        self, request: Request, template: str, status_code: int = 200, **data: Any
    ) -> Response:
        return render(
            request, f"admin/{template}", {"admin": self, **data}, status_code=status_code
        )

    def done(self, request: Request, target: str, message: str) -> Response:
        return flash(request, RedirectResponse(target, status_code=303), message)
