"""The sample mounts the framework's admin pages at /admin: the console links them, they list
the sample's own registrations, and the console's scheduler tables are the admin's macros."""

from __future__ import annotations

import re

from mega.config import Config
from tests.factories import login, web_client


async def test_the_sample_mounts_the_admin_and_the_console_links_it(config: Config) -> None:
    async with web_client(config) as client:
        assert (await client.get("/admin/")).status_code == 303  # behind the login
        await login(client)
        console = (await client.get("/demo")).text
        assert '<a href="/admin/" id="admin-link">admin</a>' in console
        # The admin's macros, in the console's classes: the same header as the admin's table.
        head = re.search(
            r'<table class="table" id="sched-ticks" hidden>\s*<thead><tr>(.*?)</tr>', console, re.S
        )
        assert head is not None
        assert re.findall(r"<th scope=\"col\">([^<]+)</th>", head.group(1)) == [
            "tick (UTC)",
            "source",
            "winner",
            "skipped",
        ]

        admin = await client.get("/admin/")
        assert admin.status_code == 200
        lanes = re.findall(r'<tr data-lane="([^"]+)">', admin.text)
        assert lanes == [
            "EmailJob",
            "TenantJob",
            "FairTenantJob",
            "LimitedTenantJob",
            "ActivateAccountJob",
            "ResizeJob",
            "PublishJob",
            "WelcomeEmailListener",
            "SignupStatsListener",
            "WelcomeCreditListener",
            "CrmSyncListener",
        ]
        assert 'data-schedule="CronCounterSchedule"' in admin.text
        assert 'href="/admin/dlq/EmailJob"' in admin.text
        assert 'href="/admin/listeners/CrmSyncListener/dlq"' in admin.text
        dlq = await client.get("/admin/listeners/CrmSyncListener/dlq")
        assert "No dead letters: every failed job was retried or succeeded." in dlq.text
