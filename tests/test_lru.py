"""dpk.lru.LRU: what variants keep on the device between calls stays bounded, oldest use dropped first."""
from __future__ import annotations

import pytest

from dpk.lru import LRU


def test_keeps_the_most_recent_uses():
    cache: LRU[str] = LRU(2)
    made = []

    def make(k):
        made.append(k)
        return k.upper()

    assert cache.get_or_make("a", lambda: make("a")) == "A"
    assert cache.get_or_make("b", lambda: make("b")) == "B"
    assert cache.get_or_make("a", lambda: make("a")) == "A"  # a use: b is now the oldest
    assert cache.get_or_make("c", lambda: make("c")) == "C"
    assert list(cache) == ["a", "c"] and made == ["a", "b", "c"]


def test_the_oldest_goes_before_a_new_entry_is_made():
    cache: LRU[int] = LRU(1)
    cache.get_or_make("old", lambda: 1)
    seen = []
    cache.get_or_make("new", lambda: seen.append(dict(cache)) or 2)
    assert seen == [{}], "the old entry (its device memory) must be gone while the new one is made"


def test_a_failed_make_leaves_no_entry():
    cache: LRU[int] = LRU(2)
    with pytest.raises(RuntimeError):
        cache.get_or_make("k", lambda: (_ for _ in ()).throw(RuntimeError("capture failed")))
    assert "k" not in cache


def test_size_below_one_is_an_error():
    with pytest.raises(ValueError, match="at least 1"):
        LRU(0)


def test_use_marks_a_hit_recent_and_misses_with_none():
    cache: LRU[int] = LRU(2)
    cache.get_or_make("a", lambda: 1)
    cache.get_or_make("b", lambda: 2)
    assert cache.use("a") == 1 and cache.use("absent") is None
    cache.get_or_make("c", lambda: 3)
    assert list(cache) == ["a", "c"], "a use must keep the entry, as get_or_make's hit does"


def test_put_stores_the_newest_and_drops_the_oldest():
    cache: LRU[int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 3)  # a replaced: now the most recent
    assert list(cache.items()) == [("b", 2), ("a", 3)]
    cache.put("c", 4)
    assert list(cache.items()) == [("a", 3), ("c", 4)]
