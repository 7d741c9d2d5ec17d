"""The engine freezes the long-lived heap it loaded (engine.settle_heap): the collector skips it."""

from __future__ import annotations

import gc
import weakref

from completion_engine.config import EngineConfig
from completion_engine.engine import CompletionEngine, settle_heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_a_loaded_engine_is_frozen_and_a_later_load_collects_what_was_dropped():
    gc.unfreeze()
    try:
        engine = CompletionEngine.from_config(EngineConfig(target="tiny-random"), progress=False)
        assert gc.get_freeze_count() > 0  # the engine, loaded, sits out of the collector's walks
        cycle = Node()
        dropped = weakref.ref(cycle)
        settle_heap()
        del cycle
        gc.collect()
        assert dropped() is not None  # frozen: a cycle is not collected ...
        settle_heap()  # ... until the next load unfreezes and collects first
        assert dropped() is None
        del engine
    finally:
        gc.unfreeze()
