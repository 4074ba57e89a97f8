"""What a call does on the host: the aten operators it dispatches, and its launches, recorded."""

from __future__ import annotations

from typing import List

from torch.utils._python_dispatch import TorchDispatchMode


class DispatchedOperators(TorchDispatchMode):
    """The aten operators run inside the context, by name, in `names`."""

    def __init__(self):
        super().__init__()
        self.names: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def is_allocation(name: str) -> bool:
    return name.startswith(("empty", "new_empty"))


def record_launches(monkeypatch, launch_class) -> list:
    """From now on (for the test), calls of a package's Launch are recorded as (launch, per-call
    arguments) instead of run; returns the record."""
    called = []
    monkeypatch.setattr(launch_class, "__call__", lambda self, *args: called.append((self, args)))
    return called
