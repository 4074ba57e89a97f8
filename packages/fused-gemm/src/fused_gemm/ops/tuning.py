"""Choosing a kernel config by timing the candidates in interleaved rounds, under sustained load.

Why not Triton's autotuner: it times each candidate over ~40 ms, one after another, each call
after an L2 flush. On an H100 the same kernel's time drifts by up to 15 % within seconds (every
config of a shape runs fastest in the first round, as clocks fall while the GPU heats and meets its
power limit), so a candidate timed later looks slower than it is, and two tunings of one shape pick
different configs, 4-14 % slower than the best one. The isolated, L2-flushed calls also rank some
configs differently from back-to-back calls (a 4-warp ping-pong config is among the fastest by the
autotuner's timer and among the slower in a CUDA graph of the same calls).

Here each candidate's calls are captured in a CUDA graph, a few back-to-back calls each (as a
training step runs its products). The graphs replay with no pause between them (with a pause before
each timing, the picks still change from tuning to tuning): first a few untimed rounds that bring
the GPU to its sustained-load clocks, then timed rounds in which every candidate runs once, the
order reversing from round to round; each candidate keeps its median over the rounds, so a slow
phase of the GPU costs every candidate alike.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import torch

from .._runtime.compat import LAUNCH_ERRORS

# Untimed rounds that bring the GPU to sustained load, then timed rounds; each candidate's
# median over the timed ones is its time.
WARMUP_ROUNDS = 3
ROUNDS = 7
# GPU time of one timing: 1-2 calls of a large product (~0.8 ms), tens of a small one.
MEASUREMENT_MS = 1.0
MAX_CALLS = 32

# measure(launches, rounds) -> per launch, its time per call (ms) in each timed round.
Measure = Callable[[Sequence[Callable[[], None]], int], List[List[float]]]


def round_order(count: int, round_index: int) -> List[int]:
    """The candidates' order in a round: forward in even rounds, backward in odd ones, so that
    on average every candidate sits at the middle of the rounds' time."""
    order = list(range(count))
    return order if round_index % 2 == 0 else order[::-1]


def schedule(count: int, rounds: int) -> Iterator[Tuple[int, bool]]:
    """(candidate, timed) in replay order: WARMUP_ROUNDS untimed rounds, then `rounds` timed ones."""
    for round_index in range(WARMUP_ROUNDS + rounds):
        for index in round_order(count, round_index):
            yield index, round_index >= WARMUP_ROUNDS


def calls_per_timing(estimate_ms: float) -> int:
    """Back-to-back calls that make one timing last about MEASUREMENT_MS."""
    if not estimate_ms > 0:
        return MAX_CALLS
    return max(1, min(MAX_CALLS, math.ceil(MEASUREMENT_MS / estimate_ms)))


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off: a collection during a capture may run finalizers
    that free CUDA objects (another graph, say), which invalidates the capture."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _time_once(launch: Callable[[], None]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    launch()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def replay_rounds(launches: Sequence[Callable[[], None]], rounds: int) -> List[List[float]]:
    """Each launch's GPU time per call (ms) in each of `rounds` interleaved rounds of CUDA-graph
    replays, after WARMUP_ROUNDS untimed ones; every launch has run once (compiled)."""
    calls = calls_per_timing(min(_time_once(launch) for launch in launches))
    graphs = []
    for launch in launches:
        graph = torch.cuda.CUDAGraph()
        with _collector_paused(), torch.cuda.graph(graph):
            for _ in range(calls):
                launch()
        graphs.append(graph)
    timings = []  # (launch, start, end) in replay order
    for index, timed in schedule(len(graphs), rounds):
        if not timed:
            graphs[index].replay()
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graphs[index].replay()
        end.record()
        timings.append((index, start, end))
    torch.cuda.synchronize()
    samples = [[] for _ in launches]
    for index, start, end in timings:
        samples[index].append(start.elapsed_time(end) / calls)
    return samples


def fastest(launches: Sequence[Optional[Callable[[], None]]], measure: Measure = replay_rounds,
            rounds: int = ROUNDS) -> int:  # fmt: skip
    """Index of the fastest of `launches`, each running one candidate config on the same operands
    (idempotently: each overwrites what the others wrote); None marks a candidate that cannot
    launch. Every candidate runs once first (compiling it); one that fails there with an error
    of a config that does not fit (LAUNCH_ERRORS) drops out. With one candidate left, nothing is
    timed."""
    usable = []
    for index, launch in enumerate(launches):
        if launch is None:
            continue
        try:
            launch()
        except LAUNCH_ERRORS:
            continue
        usable.append(index)
    if not usable:
        raise RuntimeError("no candidate config of the kernel could launch on this GPU")
    if len(usable) == 1:
        return usable[0]
    samples = measure([launches[index] for index in usable], rounds)
    medians = [statistics.median(times) for times in samples]
    return usable[medians.index(min(medians))]
