"""How the pages name a host process: short enough for a phone, with what a learner needs.

`short_instance` is the framework's (mega.web, the admin pages'): `worker@host:4121:a1b2c3` ->
`a1b2c3 (pid 4121)`: the random suffix tells two runs of one pid apart, the pid is what to
kill; any other form -> its last 12 characters. The jobs page, the console, the cron page and
the admin pages all name instances this way.
"""

from __future__ import annotations

from mega.web import short_instance

__all__ = ["short_instance"]
