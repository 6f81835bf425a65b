"""Who runs a control command (`mega jobs`, `mega schedules`, `mega dlq`), and the audit row
each of their actions writes (mega/audit.py)."""

from __future__ import annotations

import getpass
import socket
import sys
from collections.abc import Sequence

from mega.context import Context


def default_by() -> str:
    """Who changes a pause when `--by` is not given: `user@host`."""
    try:
        user = getpass.getuser()
    except OSError:  # no USER, LOGNAME and no passwd entry (a bare container)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


async def audited(
    ctx: Context, action: str, target: str, ids: Sequence[str] = (), detail: str = ""
) -> None:
    """The audit row of a control command's action (mega/audit.py), as `cli:user@host`. The
    action is done by then: a database that cannot take the row (away, or none configured)
    costs a line on stderr, not the command. Its tables are made where missing, as `mega
    token` does."""
    from mega import audit
    from mega.runtime.bootstrap import open_database

    if not ctx.database_url:
        return
    try:
        db = await open_database(ctx.database_url, migrate=True)
        try:
            await audit.write(db, f"cli:{default_by()}", action, target, ids, detail)
        finally:
            db.dispose()
    except Exception as exc:  # whatever the database says, the action stands
        print(
            f"mega: the audit of this {action} was not written ({type(exc).__name__}: {exc})",
            file=sys.stderr,
        )
