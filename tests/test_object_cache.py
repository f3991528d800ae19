"""Bounded memos: which entries a full one drops (the least recently used), by count and by weight."""

from __future__ import annotations

import pytest

from superopt.object_cache import BoundedDict, ObjectCache


def test_object_cache_keeps_values_by_identity_and_key():
    calls: list[str] = []
    cache: ObjectCache[dict, str] = ObjectCache(limit=2)
    a, twin = {"x": 1}, {"x": 1}  # equal, unhashable, different objects
    assert cache.get(a, 1, lambda: calls.append("a1") or "A1") == "A1"
    assert cache.get(a, 1, lambda: calls.append("again") or "stale") == "A1"
    assert cache.get(twin, 1, lambda: calls.append("twin") or "T1") == "T1"  # identity, not equality
    assert cache.get(a, 2, lambda: calls.append("a2") or "A2") == "A2"  # another key: another value
    assert cache.get(a, 1, lambda: calls.append("a1 again") or "A1'") == "A1'"  # the oldest went at 3 entries
    assert calls == ["a1", "twin", "a2", "a1 again"]
    assert len(cache) == 2


def test_a_full_bounded_dict_drops_its_least_recently_used_entry():
    memo: BoundedDict[str, int] = BoundedDict(limit=3)
    memo["a"], memo["b"], memo["c"] = 1, 2, 3
    assert memo.use("a", lambda: pytest.fail("'a' is kept")) == 1  # used: now the newest
    memo["d"] = 4
    assert list(memo) == ["c", "a", "d"]  # "b" went, not "a", stored first
    memo["c"] = 30  # storing a new value is a use too
    memo["e"] = 5
    assert dict(memo) == {"d": 4, "c": 30, "e": 5}


def test_plain_reads_leave_the_order_alone():
    """`get` and `[]` are the memos' reads on every search state: they stay dict lookups."""
    memo: BoundedDict[str, int] = BoundedDict(limit=2)
    memo["a"], memo["b"] = 1, 2
    assert memo.get("a") == 1 and memo["a"] == 1
    memo["c"] = 3
    assert list(memo) == ["b", "c"]


def test_use_makes_a_missing_value_once():
    calls: list[str] = []
    memo: BoundedDict[str, int] = BoundedDict(limit=1)
    assert memo.use("a", lambda: calls.append("a") or 1) == 1
    assert memo.use("a", lambda: calls.append("a again") or 2) == 1
    assert memo.use("b", lambda: calls.append("b") or 3) == 3  # past the limit: "a" goes
    assert memo.use("a", lambda: calls.append("a made again") or 4) == 4
    assert calls == ["a", "b", "a made again"] and list(memo) == ["a"]


def test_a_weight_bound_drops_the_least_recently_used_until_it_holds():
    """Weights are summed when an entry is stored: a kept value may have grown since."""
    memo: BoundedDict[str, list[int]] = BoundedDict(limit=10, weight=len, max_weight=5)
    memo["a"], memo["b"] = [1, 2], [3, 4]
    memo.use("a", list).extend([5, 6])  # "a", now the newest, grows to 4: 6 in all, seen at the next store
    assert list(memo) == ["b", "a"]
    memo["c"] = [7]  # 7 in all: "b" goes, and 5 is within the bound
    assert list(memo) == ["a", "c"]
    memo["d"] = [0] * 9  # alone past the bound: the others go, the newest stays
    assert list(memo) == ["d"]
