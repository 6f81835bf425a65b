"""A host, once started, takes what start-up made out of the garbage collector's full passes
(`freeze_startup_heap`): the garbage start-up left is collected first, the rest is frozen."""

from __future__ import annotations

import gc
import weakref

from mega.runtime.hosts import freeze_startup_heap


class Node:
    me: Node


def test_start_up_garbage_is_collected_and_what_lives_on_is_frozen() -> None:
    kept = Node()
    cycle = Node()
    cycle.me = cycle  # garbage only a collection finds
    gone = weakref.ref(cycle)
    del cycle
    before = gc.get_freeze_count()
    try:
        freeze_startup_heap()
        assert gone() is None
        assert gc.get_freeze_count() > before
        assert not any(obj is kept for obj in gc.get_objects())  # out of the passes' sight
    finally:
        gc.unfreeze()  # back in the oldest generation, for the rest of this test process
    assert any(obj is kept for obj in gc.get_objects())
