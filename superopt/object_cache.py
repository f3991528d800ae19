"""Bounded memos: values kept per key, or per object identity, the oldest dropped past a limit.

The search builds many sGraphs from shared pieces (a kernel object, a block graph state) and
derives the same facts from them again and again: analyses, compiled size evaluators, tiling plans,
texts, floors. Kept without a bound, those facts grow with every state a long search visits (a
10-minute qknorm_gqa search held 2.3 GiB); bounded, a fact dropped is derived again when needed.
The pieces themselves are frozen dataclasses holding dicts or deep trees, so they cannot be
(cheaply) dictionary keys; their identity can (`ObjectCache`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
Obj = TypeVar("Obj")  # the object a value is derived from
V = TypeVar("V")


class BoundedDict(OrderedDict[K, V]):
    """A dict that drops its oldest entry past `limit` entries. (An OrderedDict drops it in
    constant time; a plain dict's `next(iter(d))` walks the holes its deletions leave at the
    front: 25 us per insert at 65,536 entries.)"""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        if len(self) > self.limit:
            self.popitem(last=False)


class ObjectCache(Generic[Obj, V]):
    """Values derived from an object (and a `key` of whatever else they depend on), the oldest
    dropped past `limit` entries. An entry holds its object, so the object's id is not reused
    while the entry lives."""

    def __init__(self, limit: int) -> None:
        self._entries: BoundedDict[tuple[int, Hashable], tuple[Obj, V]] = BoundedDict(limit)

    def get(self, obj: Obj, key: Hashable, compute: Callable[[], V]) -> V:
        hit = self._entries.get((id(obj), key))
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = compute()
        self._entries[id(obj), key] = (obj, value)
        return value

    def __len__(self) -> int:
        return len(self._entries)
