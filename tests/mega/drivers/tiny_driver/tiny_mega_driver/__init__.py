"""The smallest bus driver a package can add: this process's memory under a name of its own.

A real one would implement `mega.drivers.base.Bus` over its engine; this one borrows the
memory driver's, which is enough to prove that mega finds it by its entry point alone."""

from typing import ClassVar

from mega.drivers.memory import MemoryBus


class TinyBus(MemoryBus):
    driver: ClassVar[str] = "tiny"
