"""The engine freezes the long-lived heap it loaded (engine.settle_heap): the collector skips it."""

from __future__ import annotations

import gc
import weakref

from completion_engine.engine import settle_heap


class Node:
    pass


def test_settling_freezes_what_is_alive_and_refcounting_still_frees_it():
    gc.unfreeze()
    try:
        kept = [[index] for index in range(1000)]
        node = Node()
        alive = weakref.ref(node)
        settle_heap()
        assert gc.get_freeze_count() >= len(kept)
        del node
        assert alive() is None  # frozen objects are freed when nothing refers to them
    finally:
        gc.unfreeze()  # back in the collector's reach, as the other tests expect
