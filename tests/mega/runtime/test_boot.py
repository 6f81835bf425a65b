"""The shared boot path: a Context with every declared service, looked up by alias."""

from __future__ import annotations

from pathlib import Path

import pytest

from mega.errors import ConfigError
from mega.runtime.bootstrap import boot, shutdown
from tests.factories import config_for


async def test_context_serves_every_alias_and_names_unknown_ones(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    ctx = await boot(config_for(tmp_path, nats_url, redis_url), role="worker", database=False)
    try:
        assert await ctx.cache("main").native.ping() is True
        assert ctx.bus("jobs").native.is_connected
        assert await ctx.lock("main").acquire("boot-test", 1000) is not None
        unknown = r"services.caches: no alias 'nope' \(declared: main\)"
        with pytest.raises(ConfigError, match=unknown):
            ctx.cache("nope")
        with pytest.raises(ConfigError, match=r"services\.buses: no alias 'x'"):
            ctx.bus("x")
        # Hosts without a web app open the database only when a job or schedule uses it.
        assert ctx.database is None
        ctx.db.ping()
        assert ctx.database is not None
    finally:
        await shutdown(ctx)
    assert ctx.bus("jobs").native.is_closed
