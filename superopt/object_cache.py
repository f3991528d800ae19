"""Values kept per object identity, for objects that are unhashable or slow to hash.

The search builds many sGraphs from shared pieces (a kernel object, a block graph state) and
derives the same facts from them again and again: analyses, compiled size evaluators, tiling plans,
texts. Those pieces are frozen dataclasses holding dicts or deep trees, so they cannot be (cheaply)
dictionary keys; their identity can. An entry holds its object, so the object's id is not reused
while the entry lives.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Obj = TypeVar("Obj")  # the object a value is derived from
V = TypeVar("V")


class ObjectCache(Generic[Obj, V]):
    """Values derived from an object (and a `key` of whatever else they depend on), the oldest
    dropped past `limit` entries."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: dict[tuple[int, Hashable], tuple[Obj, V]] = {}

    def get(self, obj: Obj, key: Hashable, compute: Callable[[], V]) -> V:
        hit = self._entries.get((id(obj), key))
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = compute()
        self._entries[id(obj), key] = (obj, value)
        if len(self._entries) > self.limit:
            del self._entries[next(iter(self._entries))]  # the oldest
        return value
