"""Choosing a kernel config by timing the candidates in interleaved rounds.

Why not Triton's autotuner: it times each candidate over ~40 ms, one after another, each call
after an L2 flush. On the H100 the same kernel's time drifted by up to 15 % within seconds
under sustained load (NOTES.md, run 57: every config of a shape was fastest in the first round,
as clocks fall while the GPU heats), so a candidate timed later looked slower than it is, and
two tunings of one shape picked different configs, 4-14 % slower than the best one. The
isolated, L2-flushed calls also ranked some configs differently from back-to-back calls (a
4-warp ping-pong config was among the fastest by the autotuner's timer and among the slower in
a CUDA graph of the same calls).

Here every candidate is timed once per round, the order reversing from round to round, and
keeps its median over the rounds: a slow phase of the GPU costs every candidate alike. Each
timing is a few back-to-back calls, as a training step runs its products. The calls are queued
behind a GPU sleep, so the host's launch time is not counted (a small product runs faster
than its launch).
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, List, Optional, Sequence

import torch

from .._compat import LAUNCH_ERRORS

# Rounds over the candidates; each candidate's median over them is its time.
ROUNDS = 7
# GPU time of one timing: 1-2 calls of a large product (~0.8 ms), tens of a small one.
MEASUREMENT_MS = 1.0
MAX_CALLS = 32
# GPU cycles of sleep per queued call, so the host has queued a timing's calls before the first
# one runs: ~100 us at the H100's 1.98 GHz, above a direct launch's host time (tens of us).
SLEEP_CYCLES_PER_CALL = 200_000

Timer = Callable[[Callable[[], None], int], float]


def time_calls(launch: Callable[[], None], calls: int) -> float:
    """GPU milliseconds per call of `calls` back-to-back launches (queued before the GPU starts them)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES_PER_CALL * calls)
    start.record()
    for _ in range(calls):
        launch()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def round_order(count: int, round_index: int) -> List[int]:
    """The candidates' order in a round: forward in even rounds, backward in odd ones, so that
    on average every candidate sits at the middle of the rounds' time."""
    order = list(range(count))
    return order if round_index % 2 == 0 else order[::-1]


def calls_per_timing(estimate_ms: float) -> int:
    """Back-to-back calls that make one timing last about MEASUREMENT_MS."""
    if not estimate_ms > 0:
        return MAX_CALLS
    return max(1, min(MAX_CALLS, math.ceil(MEASUREMENT_MS / estimate_ms)))


def fastest(launches: Sequence[Optional[Callable[[], None]]], timer: Timer = time_calls, rounds: int = ROUNDS) -> int:
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
    calls = calls_per_timing(min(timer(launches[index], 1) for index in usable))
    samples = {index: [] for index in usable}
    for round_index in range(rounds):
        for position in round_order(len(usable), round_index):
            index = usable[position]
            samples[index].append(timer(launches[index], calls))
    return min(usable, key=lambda index: statistics.median(samples[index]))
