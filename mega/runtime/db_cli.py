"""The commands on the application's database: `mega db` (the framework's migrations),
`mega token` (API tokens) and `mega audit` (who did what from the console and the control
commands). Each opens the database alone: no bus, no host."""

from __future__ import annotations

import asyncio
import sys

from mega.config import Config
from mega.errors import ConfigError, MegaError


async def run_db_command(config: Config, action: str) -> None:
    """`mega db upgrade` (the framework's tables to the newest migration) and `mega db
    current`."""
    from mega.runtime.bootstrap import open_database
    from mega.runtime.migrate import current, head, upgrade

    db = await open_database(config.database_url, migrate=False)
    try:
        if action == "upgrade":
            before, after = await asyncio.to_thread(upgrade, db)
            change = "already at" if before == after else f"upgraded from {before or 'empty'} to"
            print(f"database {db.redacted_url}: {change} {after}")
        else:
            now = await asyncio.to_thread(current, db)
            print(f"database {db.redacted_url}: at {now or 'nothing (empty)'}; newest {head()}")
    finally:
        db.dispose()


async def run_token_command(
    config: Config, action: str, *, name: str | None, scope: str, expires: str
) -> None:
    """`mega token create NAME`, `list` and `revoke NAME` (mega/web/tokens.py): `scope` and
    `expires` as `--scope` and `--expires` give them (create)."""
    from mega.runtime.bootstrap import open_database
    from mega.web import tokens

    if action != "list" and not name:
        raise ConfigError(f"mega token {action} needs a NAME: mega token {action} NAME")
    token_name = name or ""
    db = await open_database(config.database_url, migrate=True)
    try:
        if action == "create":
            scopes = tokens.parse_scopes(scope)
            expires_in = tokens.parse_expires(expires)
            secret = await db.run(
                lambda s: tokens.create_token(s, token_name, scopes=scopes, expires_in=expires_in)
            )
            print(secret)
            ends = "never expires" if expires_in is None else f"expires in {expires}"
            print(
                f"token {name!r} created ({ends}; scopes {','.join(scopes)}): it is "
                "shown this once, keep it somewhere safe",
                file=sys.stderr,
            )
        elif action == "revoke":
            if not await db.run(lambda session: tokens.revoke_token(session, token_name)):
                raise MegaError(f"no token named {name!r} (mega token list shows them)")
            print(f"token {name!r} revoked")
        else:
            rows = await db.run(tokens.list_tokens)
            for row in rows:
                print(row.describe())
            if not rows:
                print("no API tokens yet: mega token create NAME")
    except tokens.TokenError as exc:
        raise MegaError(str(exc)) from exc
    finally:
        db.dispose()


async def run_audit_command(
    config: Config, *, target: str | None, job_id: str | None, limit: int
) -> None:
    """`mega audit list`: the console's and the control commands' actions, newest first."""
    from mega import audit
    from mega.runtime.bootstrap import open_database

    db = await open_database(config.database_url, migrate=True)
    try:
        rows = await db.run(lambda s: audit.entries(s, target=target, job_id=job_id, limit=limit))
    finally:
        db.dispose()
    for row in rows:
        print(row.describe())
    if not rows:
        print("no console actions recorded" + (" of these" if target or job_id else ""))
