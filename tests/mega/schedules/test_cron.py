"""mega.schedules.cron: pure tables, no servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from mega.errors import ConfigError
from mega.schedules import cron
from mega.schedules.cron import Cron, CronError

NY = "America/New_York"
BERLIN = "Europe/Berlin"


def iso(runs: list[datetime]) -> list[str]:
    return [run.isoformat() for run in runs]


@pytest.mark.parametrize(
    ("expr", "after", "tz", "expected"),
    [
        # 5 fields, minute resolution
        (
            "*/15 * * * *",
            datetime(2024, 1, 1, 10, 7, tzinfo=UTC),
            "UTC",
            ["2024-01-01T10:15:00+00:00", "2024-01-01T10:30:00+00:00", "2024-01-01T10:45:00+00:00"],
        ),
        (
            "0 3 * * *",
            datetime(2024, 1, 1, 3, 0, tzinfo=UTC),  # strictly after: 03:00 itself is not next
            "UTC",
            ["2024-01-02T03:00:00+00:00", "2024-01-03T03:00:00+00:00", "2024-01-04T03:00:00+00:00"],
        ),
        # 6 fields: seconds FIRST
        (
            "*/30 * * * * *",
            datetime(2024, 1, 1, 10, 0, 5, tzinfo=UTC),
            "UTC",
            ["2024-01-01T10:00:30+00:00", "2024-01-01T10:01:00+00:00", "2024-01-01T10:01:30+00:00"],
        ),
        (
            "15 30 9 * * *",
            datetime(2024, 1, 1, tzinfo=UTC),
            "UTC",
            ["2024-01-01T09:30:15+00:00", "2024-01-02T09:30:15+00:00", "2024-01-03T09:30:15+00:00"],
        ),
        # zones: results carry the zone's offset
        (
            "0 9 * * *",
            datetime(2024, 1, 1, 1, 0, tzinfo=UTC),  # 10:00 in Seoul: today's 09:00 is past
            "Asia/Seoul",
            ["2024-01-02T09:00:00+09:00", "2024-01-03T09:00:00+09:00", "2024-01-04T09:00:00+09:00"],
        ),
        (
            "0 12 * * 1-5",
            datetime(2024, 1, 5, 18, 0, tzinfo=UTC),  # Friday 13:00 in New York
            NY,
            ["2024-01-08T12:00:00-05:00", "2024-01-09T12:00:00-05:00", "2024-01-10T12:00:00-05:00"],
        ),
        # day-of-month OR day-of-week when both are restricted (Vixie cron)
        (
            "0 0 1 * 1",
            datetime(2024, 1, 1, tzinfo=UTC),
            "UTC",
            ["2024-01-08T00:00:00+00:00", "2024-01-15T00:00:00+00:00", "2024-01-22T00:00:00+00:00"],
        ),
        (
            "@daily",
            datetime(2024, 1, 1, 12, tzinfo=UTC),
            "UTC",
            ["2024-01-02T00:00:00+00:00", "2024-01-03T00:00:00+00:00", "2024-01-04T00:00:00+00:00"],
        ),
        (
            "0 0 29 2 *",
            datetime(2024, 3, 1, tzinfo=UTC),
            "UTC",
            ["2028-02-29T00:00:00+00:00", "2032-02-29T00:00:00+00:00", "2036-02-29T00:00:00+00:00"],
        ),
    ],
)
def test_next_runs_table(expr: str, after: datetime, tz: str, expected: list[str]) -> None:
    assert iso(cron.next_runs(expr, 3, after, tz)) == expected
    assert cron.next(expr, after, tz).isoformat() == expected[0]


@pytest.mark.parametrize(
    ("expr", "after", "tz", "n", "expected"),
    [
        # New York spring forward 2024-03-10 02:00 EST -> 03:00 EDT: 02:30 does not exist
        (
            "30 2 * * *",
            datetime(2024, 3, 9, 12),
            NY,
            2,
            ["2024-03-11T02:30:00-04:00", "2024-03-12T02:30:00-04:00"],
        ),
        (
            "0 * * * *",
            datetime(2024, 3, 10, 0, 30),
            NY,
            3,
            ["2024-03-10T01:00:00-05:00", "2024-03-10T03:00:00-04:00", "2024-03-10T04:00:00-04:00"],
        ),
        (
            "*/30 * * * * *",
            datetime(2024, 3, 10, 1, 59, 15),
            NY,
            3,
            ["2024-03-10T01:59:30-05:00", "2024-03-10T03:00:00-04:00", "2024-03-10T03:00:30-04:00"],
        ),
        # New York fall back 2024-11-03 02:00 EDT -> 01:00 EST: 01:xx happens twice
        (
            "30 1 * * *",
            datetime(2024, 11, 2, 12),
            NY,
            2,
            ["2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"],
        ),
        (
            "0 * * * *",
            datetime(2024, 11, 3, 0, 30),
            NY,
            4,
            [
                "2024-11-03T01:00:00-04:00",
                "2024-11-03T01:00:00-05:00",
                "2024-11-03T02:00:00-05:00",
                "2024-11-03T03:00:00-05:00",
            ],
        ),
        (
            "*/20 * * * * *",
            datetime(2024, 11, 3, 5, 59, 30, tzinfo=UTC),
            NY,
            3,
            ["2024-11-03T01:59:40-04:00", "2024-11-03T01:00:00-05:00", "2024-11-03T01:00:20-05:00"],
        ),
        # starting on the first pass of the repeat: the second pass is still ahead
        (
            "*/20 * * * *",
            datetime(2024, 11, 3, 5, 50, tzinfo=UTC),
            NY,
            4,
            [
                "2024-11-03T01:00:00-05:00",
                "2024-11-03T01:20:00-05:00",
                "2024-11-03T01:40:00-05:00",
                "2024-11-03T02:00:00-05:00",
            ],
        ),
        # starting on the second pass: only the rest of the second pass is ahead
        (
            "*/20 * * * *",
            datetime(2024, 11, 3, 6, 10, tzinfo=UTC),
            NY,
            3,
            ["2024-11-03T01:20:00-05:00", "2024-11-03T01:40:00-05:00", "2024-11-03T02:00:00-05:00"],
        ),
        (
            "30 1 * * *",
            datetime(2024, 11, 3, 6, 10, tzinfo=UTC),
            NY,
            1,
            ["2024-11-04T01:30:00-05:00"],
        ),
        # Berlin spring forward 2024-03-31 02:00 CET -> 03:00 CEST
        (
            "30 2 * * *",
            datetime(2024, 3, 30, 12),
            BERLIN,
            2,
            ["2024-04-01T02:30:00+02:00", "2024-04-02T02:30:00+02:00"],
        ),
        (
            "0 * * * *",
            datetime(2024, 3, 31, 0, 30),
            BERLIN,
            3,
            ["2024-03-31T01:00:00+01:00", "2024-03-31T03:00:00+02:00", "2024-03-31T04:00:00+02:00"],
        ),
        # Berlin fall back 2024-10-27 03:00 CEST -> 02:00 CET
        (
            "30 2 * * *",
            datetime(2024, 10, 26, 12),
            BERLIN,
            2,
            ["2024-10-27T02:30:00+02:00", "2024-10-28T02:30:00+01:00"],
        ),
        (
            "0 * * * *",
            datetime(2024, 10, 27, 1, 30),
            BERLIN,
            3,
            ["2024-10-27T02:00:00+02:00", "2024-10-27T02:00:00+01:00", "2024-10-27T03:00:00+01:00"],
        ),
    ],
)
def test_dst_table(expr: str, after: datetime, tz: str, n: int, expected: list[str]) -> None:
    assert iso(cron.next_runs(expr, n, after, tz)) == expected


@pytest.mark.parametrize(
    ("expr", "tz", "day", "count"),
    [
        ("0 * * * *", NY, datetime(2024, 11, 3), 25),  # follows real time: 25 hours that day
        ("0 * * * *", NY, datetime(2024, 3, 10), 23),
        ("30 1 * * *", NY, datetime(2024, 11, 3), 1),  # fixed hour: once
        ("30 2 * * *", NY, datetime(2024, 3, 10), 0),  # skipped, not invented
        ("0 * * * *", BERLIN, datetime(2024, 10, 27), 25),
        ("30 2 * * *", BERLIN, datetime(2024, 10, 27), 1),
        ("30 2 * * *", BERLIN, datetime(2024, 3, 31), 0),
        ("0 * * * *", "UTC", datetime(2024, 3, 31), 24),
    ],
)
def test_runs_per_dst_day(expr: str, tz: str, day: datetime, count: int) -> None:
    zone = ZoneInfo(tz)
    start = day.replace(tzinfo=zone)
    end = (day + timedelta(days=1)).replace(tzinfo=zone)
    runs = cron.next_runs(expr, 30, start - timedelta(microseconds=1), tz)
    assert sum(1 for run in runs if start <= run < end) == count
    instants = [run.astimezone(UTC) for run in runs]
    assert instants == sorted(set(instants))  # ascending, no instant twice


def test_tz_accepts_tzinfo_objects_and_naive_after_is_wall_time() -> None:
    after = datetime(2024, 6, 1, 8, 0)
    assert cron.next("0 9 * * *", after, ZoneInfo(BERLIN)).isoformat() == (
        "2024-06-01T09:00:00+02:00"
    )
    fixed = timezone(timedelta(hours=5, minutes=30))
    assert cron.next("0 9 * * *", after, fixed).isoformat() == "2024-06-01T09:00:00+05:30"


def test_defaults_now_and_host_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    before = datetime.now(UTC)
    run = cron.next("* * * * * *")
    assert run.utcoffset() == timedelta(hours=9)
    assert before < run <= before + timedelta(seconds=1)


def test_n_zero_and_negative() -> None:
    assert cron.next_runs("* * * * *", 0) == []
    with pytest.raises(ValueError, match="n must be"):
        cron.next_runs("* * * * *", -1)


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "nope",
        "* * * *",  # 4 fields
        "* * * * * * *",  # 7 fields (years) are not offered
        "60 * * * *",
        "* 24 * * *",
        "* * 32 * *",
        "*/0 * * * *",
        "60 * * * * *",  # a seconds field out of range
        "0 0 31 2 *",  # never fires
        "H * * * *",  # hashed fields need an id we do not have
        None,
        5,
        b"* * * * *",
        ["*", "*", "*", "*", "*"],
        object(),
    ],
)
def test_invalid_expressions(expr: object) -> None:
    assert cron.is_valid(expr) is False
    with pytest.raises(CronError) as caught:
        cron.validate(expr)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, ConfigError)
    assert caught.value.code == "cron.invalid"
    assert caught.value.message


@pytest.mark.parametrize(
    "expr", ["* * * * *", "*/30 * * * * *", "0 3 * * mon-fri", " 0  3 * * * ", "@hourly"]
)
def test_valid_expressions(expr: str) -> None:
    assert cron.is_valid(expr) is True
    cron.validate(expr)


def test_error_messages_name_the_problem() -> None:
    with pytest.raises(CronError, match="has 4 fields; expected 5"):
        cron.validate("* * * *")
    with pytest.raises(CronError, match="never fires"):
        cron.validate("0 0 30 2 *")


@pytest.mark.parametrize("tz", ["Mars/Base", "Not A Zone", "", "../../etc/passwd"])
def test_unknown_zone(tz: str) -> None:
    with pytest.raises(CronError) as caught:
        cron.next("* * * * *", tz=tz)
    assert caught.value.code == "cron.timezone"
    assert "time zone" in caught.value.message


def test_cron_namespace() -> None:
    assert Cron.is_valid("* * * * *") is True
    assert Cron.is_valid("nope") is False
    after = datetime(2024, 1, 1, tzinfo=UTC)
    assert Cron.next("0 * * * *", after, "UTC") == cron.next("0 * * * *", after, "UTC")
    assert len(Cron.next_runs("0 * * * *", 5, after, "UTC")) == 5
    with pytest.raises(CronError):
        Cron.validate("nope")
