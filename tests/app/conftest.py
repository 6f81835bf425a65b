"""Fixtures of the sample app's tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mega import Config
from tests.factories import sample_config_for


@pytest.fixture
def config(
    tmp_path: Path, nats_factory: Callable[[], Any], redis_factory: Callable[[], Any]
) -> Config:
    """The sample's config on servers of this test's own (a test may stop them)."""
    return sample_config_for(tmp_path, nats_factory().url, redis_factory().url)
