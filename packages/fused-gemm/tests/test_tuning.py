"""ops.tuning: how candidates are timed and ranked (no GPU: the timer is a model of one).

The GPU model: each candidate has a true time per call, and the GPU slows as it keeps working
(clocks fall as it heats: up to 15 % within seconds on an H100), so a timing
taken later reads slower. Timing candidates one after another then favours the early ones;
interleaved rounds must not.
"""

from __future__ import annotations

import pytest

from fused_gemm._runtime.compat import LAUNCH_ERRORS
from fused_gemm.ops import tuning

OutOfResources = LAUNCH_ERRORS[0]  # triton.runtime.errors.OutOfResources(required, limit, name)


class DriftingGpu:
    """A model of the GPU whose times per call grow with the GPU time spent so far (`drift` per
    millisecond); `measure` replays candidates as ops.tuning.replay_rounds does."""

    def __init__(self, true_ms, drift=0.002):
        self.true_ms = true_ms
        self.drift = drift
        self.busy_ms = 0.0
        self.replayed = []  # candidate indices in replay order, warm-up rounds included

    def launch(self, index):
        return lambda: index

    def run(self, index, calls):
        per_call = self.true_ms[index] * (1 + self.drift * self.busy_ms)
        self.busy_ms += per_call * calls
        self.replayed.append(index)
        return per_call

    def measure(self, launches, rounds):
        indices = [launch() for launch in launches]
        calls = tuning.calls_per_timing(min(self.true_ms[i] for i in indices))
        samples = [[] for _ in launches]
        for position, timed in tuning.schedule(len(launches), rounds):
            per_call = self.run(indices[position], calls)
            if timed:
                samples[position].append(per_call)
        return samples


def sequential_pick(gpu: DriftingGpu, samples: int) -> int:
    """What timing each candidate in turn, `samples` times, would pick."""
    times = [min(gpu.run(index, 1) for _ in range(samples)) for index in range(len(gpu.true_ms))]
    return times.index(min(times))


def test_interleaved_rounds_pick_the_fastest_under_drift():
    # The fastest candidate (index 3) is 4 % faster than the first; the drift over the tuning
    # is larger than that, so timing one candidate after another picks the first.
    true_ms = [0.80, 0.82, 0.81, 0.77, 0.83]
    assert sequential_pick(DriftingGpu(true_ms), samples=20) == 0
    gpu = DriftingGpu(true_ms)
    assert tuning.fastest([gpu.launch(i) for i in range(len(true_ms))], measure=gpu.measure) == 3


def test_rounds_alternate_their_order():
    gpu = DriftingGpu([0.5, 0.25, 1.0], drift=0.0)
    tuning.fastest([gpu.launch(i) for i in range(3)], measure=gpu.measure, rounds=2)
    rounds = [[0, 1, 2], [2, 1, 0]] * 3
    assert gpu.replayed == [i for order in rounds[: tuning.WARMUP_ROUNDS + 2] for i in order]


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
    assert tuning.fastest(launches, measure=gpu.measure) == 3
    assert calls == ["failed"]  # tried once, never timed
    assert set(gpu.replayed) == {1, 2}


def test_a_single_usable_candidate_is_not_timed():
    gpu = DriftingGpu([0.1, 0.2])

    def does_not_fit():
        raise OutOfResources(300, 255, "registers")

    assert tuning.fastest([does_not_fit, gpu.launch(1)], measure=gpu.measure) == 1
    assert gpu.replayed == []


def test_no_usable_candidate_is_an_error():
    def does_not_fit():
        raise OutOfResources(262144, 232448, "shared memory")

    with pytest.raises(RuntimeError, match="no candidate config"):
        tuning.fastest([does_not_fit, None], measure=DriftingGpu([]).measure)


def test_other_launch_errors_propagate():
    def broken():
        raise ValueError("bad argument")

    with pytest.raises(ValueError, match="bad argument"):
        tuning.fastest([broken, lambda: None], measure=DriftingGpu([0.1, 0.1]).measure)
