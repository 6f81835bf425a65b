"""mega.web.admin: the operator's pages over the whole fleet (queues, listener groups, workers,
schedulers, schedules, one job's life, the dead letters), as a router any app mounts:

    from mega.web import admin_router
    app = create_web_app(config, ctx, routers=[admin_router(prefix="/admin")])

`fleet` holds the data helpers the pages use, for an app's own pages to show the same rows;
the Jinja macros are in mega/web/templates/admin/_tables.html.
"""

from mega.web.admin.fleet import instance_rows, scheduler_instances, short_instance, tick_rows
from mega.web.admin.routes import admin_router

__all__ = [
    "admin_router",
    "instance_rows",
    "scheduler_instances",
    "short_instance",
    "tick_rows",
]
