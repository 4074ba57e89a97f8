"""pytest plugin shared by every package: markers, exact skips, seeding, summary.

Loaded by the repository's root conftest.py, so `python -m pytest` from the root uses it
whether or not the packages are installed.
"""

from __future__ import annotations

import collections
import json
import os
import platform
import zlib

import pytest
import torch
import triton

from . import aot, bench
from .runtime import (
    aot_blocker,
    gpu_available,
    interpreting,
    kernel_device,
    kernel_execution_blocker,
    torch_compile_blocker,
    torch_dynamo_blocker,
)
from .threads import one_interpreted_kernel_at_a_time  # noqa: F401 - a fixture for every suite

MARKERS = {
    "kernels": "launches Triton kernels: runs on a CUDA GPU, or on a CPU under Triton 3.x's interpreter",
    "gpu(reason)": "needs a CUDA GPU (large shapes, int64 offsets, timing); reason says why",
    "aot": "ahead-of-time compile check to cubins for sm_80 and sm_90; needs compiled (not interpreted) kernels",
    "torch_compile": "runs torch.compile: skipped where the loaded Triton cannot serve this torch's compiler",
    "torch_dynamo": (
        "calls torch code that imports torch._dynamo (optimizer steps, torch.utils.checkpoint, transformers, "
        "custom-op autograd): skipped where it cannot import beside the loaded Triton"
    ),
}


def pytest_addoption(parser):
    parser.addoption(
        "--bench-table",
        default=os.environ.get("TRITONFORMER_BENCH_TABLE"),
        help="write the benchmark tables (markdown) to this file",
    )
    parser.addoption(
        "--summary-json",
        default=os.environ.get("TRITONFORMER_SUMMARY"),
        help="write the run's counts (passed, skipped and why, compiled cubins) to this JSON file",
    )


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def _gpu_skip_reason(item):
    marker = item.get_closest_marker("gpu")
    why = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
    if interpreting():
        return f"runs compiled on a CUDA GPU, and TRITON_INTERPRET=1 is set ({why})"
    if not gpu_available():
        return f"needs a CUDA GPU: {why}"
    return None


def pytest_collection_modifyitems(config, items):
    kernel_reason = kernel_execution_blocker()
    compile_reason = aot_blocker()
    torch_compile_reason = torch_compile_blocker()
    for item in items:
        reason = None
        if item.get_closest_marker("gpu"):
            reason = _gpu_skip_reason(item)
        elif item.get_closest_marker("kernels"):
            reason = kernel_reason
        if item.get_closest_marker("aot") and compile_reason:
            reason = compile_reason
        if item.get_closest_marker("torch_compile") and torch_compile_reason and not reason:
            reason = torch_compile_reason
        if item.get_closest_marker("torch_dynamo") and not reason:
            reason = torch_dynamo_blocker()  # imported (seconds) only when a marked test is collected
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def device() -> str:
    """The device that kernel inputs live on here: 'cuda', or 'cpu' under the interpreter."""
    return kernel_device()


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Fresh, reproducible random inputs: each test seeds torch from its own id."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _environment_line() -> str:
    where = "GPU " + torch.cuda.get_device_name() if gpu_available() else "CPU only"
    mode = "interpreter" if interpreting() else "compiled"
    return (
        f"tritonformer: torch {torch.__version__}, triton {triton.__version__}, {where}, kernels {mode}, "
        f"python {platform.python_version()}"
    )


def _skip_reasons(terminalreporter) -> collections.Counter:
    reasons = collections.Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    return reasons


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """The cubins a test compiles ride on its report (user_properties), so that the summary
    counts them under pytest-xdist too, whose workers are other processes."""
    start = len(aot.COMPILED)
    yield
    for name, arch in aot.COMPILED[start:]:
        item.user_properties.append(("cubin", (name, arch)))


def _cubins(terminalreporter) -> list:
    """(kernel, arch) of every cubin the run's tests compiled, from their reports."""
    return [
        tuple(value)
        for key in ("passed", "failed")
        for report in terminalreporter.stats.get(key, [])
        for name, value in getattr(report, "user_properties", ())
        if name == "cubin"
    ]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    stats = terminalreporter.stats
    counts = {key: len(stats.get(key, [])) for key in ("passed", "failed", "error", "skipped")}
    reasons = _skip_reasons(terminalreporter)
    cubins = _cubins(terminalreporter)
    terminalreporter.section("tritonformer summary")
    terminalreporter.write_line(_environment_line())
    archs = sorted({arch for _, arch in cubins})
    terminalreporter.write_line(
        f"ran {counts['passed'] + counts['failed']} tests ({counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['error']} errors); compiled {len(cubins)} kernel cubins ahead of time "
        f"(sm_{', sm_'.join(map(str, archs)) or '-'}); skipped {counts['skipped']}"
    )
    for reason, n in reasons.most_common():
        terminalreporter.write_line(f"  skipped {n}: {reason}")
    if bench.ROWS:
        tables = bench.markdown_tables(bench.ROWS)
        terminalreporter.write_line(_environment_line())
        terminalreporter.write_line(tables)
        path = config.getoption("--bench-table")
        if path:
            with open(path, "a") as f:
                f.write(_environment_line() + "\n\n" + tables + "\n")
    path = config.getoption("--summary-json")
    if path:
        with open(path, "w") as f:
            json.dump(
                dict(
                    counts,
                    compiled=len(cubins),
                    skip_reasons=dict(reasons),
                    environment=_environment_line(),
                ),
                f,
                indent=1,
            )
