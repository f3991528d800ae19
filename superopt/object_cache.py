"""Bounded memos: values kept per key, or per object identity, the least recently used dropped past a limit.

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
    """A dict that drops its least recently used entries past `limit` entries and, given a
    `weight` per value, past `max_weight` in all. Weights are summed when an entry is stored, as
    a value may grow while it is kept (a lazily generated block space). An entry is used when it
    is stored and when it is read through `use`; plain reads (`get`, `[]`) leave the order as it
    is, so the memos read on every search state stay at dict speed (their entries are stored
    once each: for them, least recently used is oldest). An OrderedDict drops its first entry in
    constant time; a plain dict's `next(iter(d))` walks the holes its deletions leave at the
    front: 25 us per insert at 65,536 entries."""

    def __init__(self, limit: int, weight: Callable[[V], int] | None = None, max_weight: int = 0) -> None:
        super().__init__()
        self.limit = limit
        self.weight = weight
        self.max_weight = max_weight

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        if len(self) > self.limit or self.weight is not None:
            self._shrink()

    def use(self, key: K, make: Callable[[], V]) -> V:
        """The value of `key`, made and stored when missing; either way now the most recently used."""
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = make()
        self[key] = value
        return value

    def _shrink(self) -> None:
        """Drop the least recently used entries until both bounds hold (the newest stays, even
        alone past `max_weight`: it is the one in use)."""
        while len(self) > self.limit:
            self.popitem(last=False)
        if self.weight is not None:
            kept = sum(map(self.weight, self.values()))
            while kept > self.max_weight and len(self) > 1:
                kept -= self.weight(self.popitem(last=False)[1])


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
