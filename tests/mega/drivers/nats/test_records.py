"""What only the nats driver's record stores show (what every driver's show is
tests/mega/drivers/test_records.py): a bucket's keep follows the lane's only with apply_limits,
and a delete marker is no record."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from nats.js.errors import NotFoundError

from mega.drivers.base import DriverUnavailable, Lane
from mega.drivers.nats.bus import NatsBus
from mega.drivers.nats.names import BUCKET_STREAM_PREFIX, bucket_of, record_key


def job_lane(prefix: str, keep_s: float) -> Lane:
    return Lane("job", f"{prefix}_kv", f"{prefix}.kv", 1, 30, 3600, keep_status_s=keep_s)


async def test_a_buckets_keep_changes_only_with_apply_limits(
    nats_bus: NatsBus, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    lane = job_lane(prefix, 60)
    await nats_bus.ensure(lane, apply_limits=False)
    stream = BUCKET_STREAM_PREFIX + bucket_of(lane, "status")
    assert (await nats_bus.js.stream_info(stream)).config.max_age == 60
    with pytest.raises(NotFoundError):  # keep 0: no bucket at all
        await nats_bus.js.stream_info(BUCKET_STREAM_PREFIX + bucket_of(lane, "result"))

    longer = dataclasses.replace(lane, keep_status_s=3600)
    with caplog.at_level(logging.WARNING):
        await nats_bus.ensure(longer, apply_limits=False)
    [line] = [r.getMessage() for r in caplog.records if "records bucket" in r.getMessage()]
    assert "keeps a record 60 s, the lane declares 3600 s: keeping the running keep" in line
    assert (await nats_bus.js.stream_info(stream)).config.max_age == 60

    await nats_bus.ensure(longer, apply_limits=True)
    assert (await nats_bus.js.stream_info(stream)).config.max_age == 3600


async def test_a_delete_marker_is_no_record_and_a_create_writes_over_it(
    nats_bus: NatsBus, prefix: str
) -> None:
    lane = job_lane(prefix, 60)
    await nats_bus.ensure(lane, apply_limits=False)
    await nats_bus.put_records(lane, "status", [("j.1", b"v")], create=False)
    kv = await nats_bus.js.key_value(bucket_of(lane, "status"))
    await kv.delete(record_key("j.1"))  # what `nats kv del` leaves: a DEL marker
    assert (await nats_bus.get_records(lane, "status", ["j.1"]))[0] is None
    assert await nats_bus.put_records(lane, "status", [("j.1", b"new")], create=True) == [True]
    assert (await nats_bus.get_records(lane, "status", ["j.1"]))[0] == b"new"


async def test_a_lane_never_ensured_says_which_bucket_is_missing(
    nats_bus: NatsBus, prefix: str
) -> None:
    lane = job_lane(prefix, 60)
    with pytest.raises(DriverUnavailable, match=f"bucket {bucket_of(lane, 'status')}"):
        await nats_bus.put_records(lane, "status", [("j", b"v")], create=False)
    with pytest.raises(DriverUnavailable, match=f"bucket {bucket_of(lane, 'status')}"):
        (await nats_bus.get_records(lane, "status", ["j"]))[0]
