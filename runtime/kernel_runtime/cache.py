"""Caches that concurrent calls can share: every entry is published whole, never filled in place.

Plans (what an op computes once per shape, stride and dtype key) are immutable values returned by
`functools.lru_cache` functions, which are thread-safe. What is decided later than the plan, such
as the config an autotuning run picks, goes into a PublishedCache: a thread that finds an entry
finds a complete one; two threads that build the same key at once both build, and the first
published value is the one every caller uses from then on.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Hashable, Optional


class PublishedCache:
    """Values by key, each published once and whole."""

    __slots__ = ("_values", "_lock", "maxsize")

    def __init__(self, maxsize: int = 1024) -> None:
        self._values: Dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        self.maxsize = maxsize

    def get(self, key: Hashable) -> Optional[Any]:
        return self._values.get(key)

    def publish(self, key: Hashable, value: Any) -> Any:
        """Store `value` under `key` unless a value is there already; return the stored one."""
        with self._lock:
            if key not in self._values and len(self._values) >= self.maxsize:
                self._values = {}
            return self._values.setdefault(key, value)

    def get_or_build(self, key: Hashable, build: Callable[[], Any]) -> Any:
        value = self._values.get(key)
        if value is None:
            value = self.publish(key, build())
        return value

    def values(self) -> tuple:
        """The published values, in publication order (a snapshot)."""
        return tuple(self._values.values())

    def clear(self) -> None:
        with self._lock:
            self._values = {}

    def __len__(self) -> int:
        return len(self._values)


def cached_plan(plan_fn: Callable, key: tuple) -> Any:
    """plan_fn(*key) through its functools.lru_cache; uncached where an argument cannot be hashed
    (a list where a tuple belongs), so that the plan's own checks get to name it."""
    try:
        return plan_fn(*key)
    except TypeError:
        return plan_fn.__wrapped__(*key)
