"""A bounded queue that takes turns between clients: one client's burst cannot starve the others."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class QueueFull(Exception):
    """The queue holds `capacity` items already."""


class FairQueue(Generic[T]):
    """Each client's items in order; clients served round-robin. Not thread-safe (the worker locks it).

    Worked example: client a puts a1, a2, a3 and client b puts b1 -> pops give a1, b1, a2, a3.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_client: OrderedDict[Hashable, deque[T]] = OrderedDict()  # next client to serve first
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def put(self, client: Hashable, item: T) -> None:
        if self._size >= self.capacity:
            raise QueueFull(f"{self._size} requests are waiting (the limit is {self.capacity})")
        self._by_client.setdefault(client, deque()).append(item)
        self._size += 1

    def pop(self) -> T | None:
        """The next client's oldest item; that client then goes to the back of the line."""
        if not self._by_client:
            return None
        client, items = next(iter(self._by_client.items()))
        item = items.popleft()
        del self._by_client[client]
        if items:
            self._by_client[client] = items
        self._size -= 1
        return item

    def remove(self, predicate: Callable[[T], bool]) -> list[T]:
        """Take out every item the predicate selects; returns them."""
        removed: list[T] = []
        for client in list(self._by_client):
            items = self._by_client[client]
            kept = deque(item for item in items if not predicate(item))
            removed.extend(item for item in items if predicate(item))
            if kept:
                self._by_client[client] = kept
            else:
                del self._by_client[client]
        self._size -= len(removed)
        return removed
