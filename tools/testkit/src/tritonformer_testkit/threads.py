"""Concurrency helpers for the thread-safety tests: calls started together, interpreted kernels in turn."""

from __future__ import annotations

import threading
from typing import Callable, List, Optional

import pytest

from .runtime import interpreting

# How long a thread waits for the others at the start line before the test fails.
START_TIMEOUT_S = 60.0


def run_in_threads(work: Callable[[int], None], count: int) -> List[Optional[BaseException]]:
    """work(i) in `count` threads released together; what each raised (None where nothing)."""
    barrier = threading.Barrier(count)
    errors: List[Optional[BaseException]] = [None] * count

    def target(i: int) -> None:
        try:
            barrier.wait(timeout=START_TIMEOUT_S)
            work(i)
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            errors[i] = error

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


@pytest.fixture
def one_interpreted_kernel_at_a_time(monkeypatch):
    """Under the interpreter, kernel bodies run one at a time (it patches triton.language for the
    kernel it runs, whoever launched it, Triton's autotuner included); the host paths around them
    stay concurrent. Compiled, nothing changes."""
    if not interpreting():
        return
    from triton.runtime import interpreter

    lock = threading.RLock()
    run = interpreter.GridExecutor.__call__

    def serialized(self, *args, **kwargs):
        with lock:
            return run(self, *args, **kwargs)

    monkeypatch.setattr(interpreter.GridExecutor, "__call__", serialized)
