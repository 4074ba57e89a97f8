"""Benchmark helpers: do_bench medians, recorded for pytest-benchmark and one table per run.

A benchmark test measures one (group, shape, provider) point with `measure`. Our kernels use
the provider name OURS; every other provider is an anchor. At the end of the run the plugin
prints one markdown table per group with each anchor's time over ours (>1: ours is faster).
Beside the do_bench median, each row carries the summed device time of the kernels one call
launches (profiler) and the host time to issue one call: where the median exceeds the kernel
time and nears the host time, the Python launch path is what is being measured.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from typing import Callable, Dict, List, Optional, Union

import torch
import triton

OURS = "tritonformer"


@dataclasses.dataclass
class BenchRow:
    group: str
    shape: str
    provider: str
    ms: float
    bytes: Optional[float] = None
    flops: Optional[float] = None
    peak_mib: Optional[float] = None
    # Host time to issue one call (no sync): when it nears `ms`, the launch path, not the GPU, bounds it.
    host_us: Optional[float] = None
    # Sum of the device time of the kernels one call launches (profiler), without gaps between them.
    kernel_ms: Optional[float] = None

    @property
    def gbps(self) -> Optional[float]:
        return None if self.bytes is None else self.bytes / self.ms / 1e6

    @property
    def tflops(self) -> Optional[float]:
        return None if self.flops is None else self.flops / self.ms / 1e9


ROWS: List[BenchRow] = []


def median_ms(fn: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median time of fn in milliseconds, CUDA events, L2 flushed between calls (Triton's do_bench)."""
    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def graph_replay(fn: Callable[[], object], calls: int = 1) -> Callable[[], None]:
    """`calls` calls of fn captured once in a CUDA graph (after warm-up on a side stream); returns
    the graph's replay: the kernels' time without the host path."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def peak_extra_mib(fn: Callable[[], object]) -> float:
    """Memory fn allocates beyond what is already held, at its peak, in MiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def host_us_per_call(fn: Callable[[], object], calls: int = 50) -> float:
    """Microseconds the host spends issuing one call, with the GPU kept busy ahead of it."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def kernel_ms_per_call(fn: Callable[[], object], calls: int = 10) -> float:
    """Device time of the kernels one call launches, summed, from the profiler (no launch gaps)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    device_us = sum(
        getattr(event, "device_time_total", None) or event.cuda_time_total
        for event in prof.key_averages()
        if event.device_type == torch.autograd.DeviceType.CUDA
    )
    return device_us / calls / 1e3


def measure(
    benchmark,
    *,
    group: str,
    shape: str,
    provider: str,
    fn: Callable[[], object],
    bytes: Optional[float] = None,
    flops: Optional[float] = None,
    memory: bool = False,
) -> BenchRow:
    """Time fn with do_bench's median, record it, and hand the same fn to pytest-benchmark.

    bytes / flops: the floor's counts (each input read once, each output written once; usual
    flop conventions), from which GB/s or TFLOP/s are derived. memory: also record peak extra MiB.
    """
    fn()  # compile / autotune outside the timing
    return _record(benchmark, BenchRow(group, shape, provider, median_ms(fn), bytes, flops), fn, memory)


def measure_paired(
    benchmark,
    *,
    group: str,
    shape: str,
    fns: Dict[str, Callable[[], object]],
    bytes: Union[None, float, Dict[str, Optional[float]]] = None,
    flops: Optional[float] = None,
    memory: bool = False,
    rounds: int = 5,
) -> Dict[str, BenchRow]:
    """Time the providers `fns` of one point in turn, `rounds` short do_bench windows each; each
    row's ms is the median of its rounds' medians. bytes: one count for all, or per provider;
    flops, memory: as for `measure`.

    For rows the host bounds (ms near host_us), the host's speed drifts over seconds (the
    autograd engine's thread hand-offs, other tenants), so two providers timed one after the
    other, each in one window, can differ by half for the same work; interleaved windows see
    the same host. pytest-benchmark records the first provider.
    """
    for fn in fns.values():
        fn()  # compile / autotune outside the timing
    round_ms: Dict[str, List[float]] = {provider: [] for provider in fns}
    for _ in range(rounds):
        for provider, fn in fns.items():
            round_ms[provider].append(median_ms(fn, warmup_ms=10, rep_ms=40))
    rows = {}
    for index, (provider, fn) in enumerate(fns.items()):
        moved = bytes.get(provider) if isinstance(bytes, dict) else bytes
        row = BenchRow(group, shape, provider, statistics.median(round_ms[provider]), moved, flops)
        rows[provider] = _record(benchmark if index == 0 else None, row, fn, memory)
    return rows


def eager_us_per_call(fn: Callable[[], object], calls: int = 100, repeats: int = 5) -> float:
    """Microseconds per call of fn called back to back, as eager code calls it, with one
    synchronization after the calls; the median of `repeats` such windows. At tiny shapes the GPU
    finishes each call's kernels before the host issues the next, so this is the host path."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    windows = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        windows.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(windows)


HOST_GROUP = "host"


def _eager_call(fn: Callable[[], object], mode: str) -> Callable[[], None]:
    """fn itself ("fwd"), or fn then the backward of the sum of its output(s) ("fwd+bwd")."""
    if mode == "fwd":
        return fn

    def forward_backward() -> None:
        out = fn()
        outs = out if isinstance(out, tuple) else (out,)
        sum(o.sum() for o in outs).backward()

    return forward_backward


def measure_host(benchmark, *, op: str, mode: str, shape: str, providers: Dict[str, Callable[[], object]]) -> None:
    """The `host` group: microseconds per eager call of each provider of one op at a tiny shape,
    timed in turn (three rounds, the median), so every provider sees the same host. providers: the
    forward calls; mode: "fwd", or "fwd+bwd" (each then runs `.sum().backward()` of its outputs)."""
    providers = {name: _eager_call(fn, mode) for name, fn in providers.items()}
    rounds: Dict[str, List[float]] = {name: [] for name in providers}
    for _ in range(3):
        for name, fn in providers.items():
            rounds[name].append(eager_us_per_call(fn))
    for index, (name, fn) in enumerate(providers.items()):
        us = statistics.median(rounds[name])
        row = BenchRow(HOST_GROUP, f"{op} {mode} {shape}", name, us / 1e3, host_us=us)
        ROWS.append(row)
        _log_row(row)
        if index == 0 and benchmark is not None:
            benchmark.extra_info.update(host_us=us)
            benchmark.pedantic(fn, rounds=5, warmup_rounds=1)


def _record(benchmark, row: BenchRow, fn: Callable[[], object], memory: bool) -> BenchRow:
    """Complete `row` (host time, kernel time, memory), log it, and hand fn to pytest-benchmark."""
    row.host_us = host_us_per_call(fn)
    row.kernel_ms = kernel_ms_per_call(fn)
    if memory:
        row.peak_mib = peak_extra_mib(fn)
    ROWS.append(row)
    _log_row(row)
    if benchmark is not None:
        benchmark.extra_info.update({k: v for k, v in dataclasses.asdict(row).items() if v is not None})

        def synchronized():
            fn()
            torch.cuda.synchronize()

        benchmark.pedantic(synchronized, rounds=5, warmup_rounds=1)
    return row


def _log_row(row: BenchRow) -> None:
    """Append the row to $TRITONFORMER_BENCH_ROWS (JSON lines) as soon as it is measured: a run cut
    short by a time limit keeps what it measured (the tables are written only at the end)."""
    path = os.environ.get("TRITONFORMER_BENCH_ROWS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dataclasses.asdict(row)) + "\n")


def load_rows(path: str) -> List[BenchRow]:
    """The rows a $TRITONFORMER_BENCH_ROWS file holds."""
    with open(path) as f:
        return [BenchRow(**json.loads(line)) for line in f if line.strip()]


def _fmt(value: Optional[float], spec: str) -> str:
    return "" if value is None else format(value, spec)


def markdown_tables(rows: List[BenchRow]) -> str:
    """One markdown table per group: ms, GB/s or TFLOP/s, MiB, and anchor time / our time."""
    by_group: Dict[str, List[BenchRow]] = {}
    for row in rows:
        by_group.setdefault(row.group, []).append(row)
    out = []
    for group, group_rows in by_group.items():
        ours = {r.shape: r for r in group_rows if r.provider == OURS}
        out.append(f"### {group}\n")
        out.append(
            "| shape | provider | ms | GB/s | TFLOP/s | peak extra MiB | time / ours | kernels ms | host us/call |"
        )
        out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in group_rows:
            ratio = r.ms / ours[r.shape].ms if r.shape in ours else None
            out.append(
                f"| {r.shape} | {r.provider} | {r.ms:.4f} | {_fmt(r.gbps, '.0f')} | {_fmt(r.tflops, '.1f')} "
                f"| {_fmt(r.peak_mib, '.0f')} | {_fmt(ratio, '.2f')} | {_fmt(r.kernel_ms, '.4f')} "
                f"| {_fmt(r.host_us, '.0f')} |"
            )
        out.append("")
    return "\n".join(out)
