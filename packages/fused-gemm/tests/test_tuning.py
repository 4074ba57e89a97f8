"""ops.tuning: how candidates are timed and ranked (no GPU: the timer is a model of one).

The GPU model: each candidate has a true time per call, and the GPU slows as it keeps working
(clocks fall as it heats: NOTES.md run 57 measured up to 15 % within seconds), so a timing
taken later reads slower. Timing candidates one after another then favours the early ones;
interleaved rounds must not.
"""

from __future__ import annotations

import pytest

from fused_gemm._compat import LAUNCH_ERRORS
from fused_gemm.ops import tuning

OutOfResources = LAUNCH_ERRORS[0]  # triton.runtime.errors.OutOfResources(required, limit, name)


class DriftingGpu:
    """A timer whose readings grow with the GPU time spent so far (`drift` per millisecond)."""

    def __init__(self, true_ms, drift=0.002):
        self.true_ms = true_ms
        self.drift = drift
        self.busy_ms = 0.0
        self.timed = []  # (candidate, calls) in timing order

    def launch(self, index):
        return lambda: index

    def timer(self, launch, calls):
        index = launch()
        per_call = self.true_ms[index] * (1 + self.drift * self.busy_ms)
        self.busy_ms += per_call * calls
        self.timed.append((index, calls))
        return per_call


def sequential_pick(gpu: DriftingGpu, samples: int) -> int:
    """What timing each candidate in turn, `samples` times, would pick."""
    times = []
    for index in range(len(gpu.true_ms)):
        times.append(min(gpu.timer(gpu.launch(index), 1) for _ in range(samples)))
    return times.index(min(times))


def test_interleaved_rounds_pick_the_fastest_under_drift():
    # The fastest candidate (index 3) is 4 % faster than the first; the drift over the tuning
    # is larger than that, so timing one candidate after another picks the first.
    true_ms = [0.80, 0.82, 0.81, 0.77, 0.83]
    assert sequential_pick(DriftingGpu(true_ms), samples=20) == 0
    gpu = DriftingGpu(true_ms)
    assert tuning.fastest([gpu.launch(i) for i in range(len(true_ms))], timer=gpu.timer) == 3


def test_every_candidate_timed_once_per_round_in_alternating_order():
    gpu = DriftingGpu([0.5, 0.25, 1.0], drift=0.0)
    tuning.fastest([gpu.launch(i) for i in range(3)], timer=gpu.timer, rounds=4)
    estimates, rounds = gpu.timed[:3], gpu.timed[3:]
    assert [calls for _, calls in estimates] == [1, 1, 1]
    # One timing lasts about MEASUREMENT_MS at the fastest candidate's estimate (0.25 ms).
    assert {calls for _, calls in rounds} == {tuning.calls_per_timing(0.25)} == {4}
    assert [index for index, _ in rounds] == [0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0]


def test_calls_per_timing_is_bounded():
    assert tuning.calls_per_timing(5.0) == 1
    assert tuning.calls_per_timing(0.3) == 4
    assert tuning.calls_per_timing(1e-4) == tuning.MAX_CALLS
    assert tuning.calls_per_timing(0.0) == tuning.MAX_CALLS


def test_candidates_that_cannot_launch_drop_out():
    gpu = DriftingGpu([0.1, 0.9, 0.5], drift=0.0)
    calls = []

    def does_not_fit():
        calls.append("failed")
        raise OutOfResources(262144, 232448, "shared memory")

    launches = [does_not_fit, gpu.launch(1), None, gpu.launch(2)]
    assert tuning.fastest(launches, timer=gpu.timer) == 3
    assert calls == ["failed"]  # tried once, never timed
    assert {index for index, _ in gpu.timed} == {1, 2}


def test_a_single_usable_candidate_is_not_timed():
    gpu = DriftingGpu([0.1, 0.2])

    def does_not_fit():
        raise OutOfResources(300, 255, "registers")

    assert tuning.fastest([does_not_fit, gpu.launch(1)], timer=gpu.timer) == 1
    assert gpu.timed == []


def test_no_usable_candidate_is_an_error():
    def does_not_fit():
        raise OutOfResources(262144, 232448, "shared memory")

    with pytest.raises(RuntimeError, match="no candidate config"):
        tuning.fastest([does_not_fit, None], timer=DriftingGpu([]).timer)


def test_other_launch_errors_propagate():
    def broken():
        raise ValueError("bad argument")

    with pytest.raises(ValueError, match="bad argument"):
        tuning.fastest([broken, lambda: None], timer=DriftingGpu([0.1, 0.1]).timer)
