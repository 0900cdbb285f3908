"""A bounded least-recently-used map for what variants keep on the device between calls (nets, bound programs,
captured graphs): each entry can hold hundreds of MB of GPU memory, so the oldest goes before a new one is made."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class LRU(OrderedDict, Generic[V]):
    """At most `size` entries, oldest use first (iteration order)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"LRU size must be at least 1, got {size}")
        super().__init__()
        self.size = size

    def use(self, key: Hashable) -> V | None:
        """The entry of `key`, now the most recent, or None."""
        if key not in self:
            return None
        self.move_to_end(key)
        return self[key]

    def get_or_make(self, key: Hashable, make: Callable[[], V]) -> V:
        """The entry of `key`, now the most recent; else `make()`'s, made after the oldest entries are dropped to
        leave room (their memory is free while it is made)."""
        if key in self:
            return self.use(key)
        self._make_room()
        return self.put(key, make())

    def put(self, key: Hashable, value: V) -> V:
        """`value` stored as the most recent entry of `key`, the oldest dropped past `size`."""
        self.pop(key, None)
        self._make_room()
        self[key] = value
        return value

    def _make_room(self) -> None:
        while len(self) >= self.size:
            self.popitem(last=False)
