"""The smallest bus driver a package can add: this process's memory under a name of its own.

A real one would implement `mega.drivers.base.Bus` over its engine; this one borrows the
memory driver's, which is enough to prove that mega finds it by its entry point alone."""

from typing import ClassVar

from mega.drivers.memory import MemoryBus


class TinyBus(MemoryBus):
    driver: ClassVar[str] = "tiny"


def check_urls(urls: list[str]) -> str:
    """The URLs a config may give a tiny bus: none, or `tiny://` ones (mega finds this function
    beside the class its entry point names, and checks a config's URLs with it)."""
    if any(url and not url.startswith("tiny://") for url in urls):
        raise ValueError(f"a tiny bus takes tiny:// URLs, not {urls}")
    return ",".join(urls)
