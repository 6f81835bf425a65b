"""Bus drivers, found by name: the four built in, and any a package adds.

    from mega.drivers import find_driver
    NatsBus = find_driver("nats")

A driver is a class that implements `mega.drivers.base.Bus`. The built-in ones are imported
only when a config names them (a worker on Redis never imports nats-py). A package adds one
with no change to mega, through the `mega.drivers` entry-point group in its pyproject.toml:

    [project.entry-points."mega.drivers"]
    sqs = "mega_sqs:SqsBus"
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import cast

from mega.constants import BUILT_IN_DRIVERS as BUILT_IN
from mega.constants import DRIVERS_ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from mega.drivers.base import Bus, LaneStats
from mega.errors import ConfigError

__all__ = ["Bus", "LaneStats", "driver_names", "find_driver"]


def driver_names() -> list[str]:
    """Every driver a config may name: the built-in ones and the installed entry points."""
    return sorted({*BUILT_IN, *(point.name for point in entry_points(group=ENTRY_POINT_GROUP))})


def find_driver(name: str) -> type[Bus]:
    """The driver class called `name`; ConfigError lists the known names when there is none.

    Args:
        name: a built-in driver's ("nats", "redis", "postgres", "memory"), or that of an
            entry point of the `mega.drivers` group.
    """
    target = BUILT_IN.get(name)
    if target is None:
        found = [point for point in entry_points(group=ENTRY_POINT_GROUP) if point.name == name]
        if not found:
            known = ", ".join(driver_names())
            raise ConfigError(
                f"unknown bus driver {name!r} (known: {known}; a package adds one through "
                f"the {ENTRY_POINT_GROUP!r} entry-point group)"
            )
        target = found[0].value
    module_name, _, class_name = target.partition(":")
    try:
        driver = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"bus driver {name!r} ({target}) cannot be loaded: {exc}") from exc
    return cast(type[Bus], driver)
