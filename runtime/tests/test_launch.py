"""Launch: argument assembly, results under the JIT path, and the compiled-kernel table's keys and
thread safety (checked on the CPU with a stand-in compiled kernel, as a GPU would return one)."""

from __future__ import annotations

import threading

import pytest
import torch
import triton
import triton.language as tl

from kernel_runtime import launch as launch_module
from kernel_runtime.launch import Launch


@triton.jit(do_not_specialize=["n"])
def scale_kernel(x_ptr, y_ptr, stride_x, n, factor, BLOCK: tl.constexpr, SQUARE: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs * stride_x, mask=mask).to(tl.float32)
    if SQUARE:
        x = x * x
    tl.store(y_ptr + offs, (x * factor).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def fill_kernel(value, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.full((BLOCK,), value, tl.float32))


def test_per_call_arguments_fill_the_slots_between_fixed_ones():
    launch = Launch(scale_kernel, (4,), stride_x=1, factor=2.0, BLOCK=32)
    x, y = object(), object()
    assert launch.arguments((x, y, 7)) == (x, y, 1, 7, 2.0, 32, False)


def test_leading_per_call_arguments_join_the_fixed_tail():
    launch = Launch(fill_kernel, (1,), BLOCK=8)
    out = object()
    assert launch.arguments((3.0, out)) == (3.0, out, 8)


def test_unknown_parameter_and_wrong_count_are_errors():
    with pytest.raises(TypeError, match="no parameter BLOCK_M"):
        Launch(scale_kernel, (1,), BLOCK_M=4)
    launch = Launch(scale_kernel, (1,), stride_x=1, factor=1.0, BLOCK=32)
    with pytest.raises(TypeError, match="takes 3 arguments, got 2"):
        launch(object(), object())


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_results_match_torch(device, dtype):
    n = 37
    x = torch.randn(2 * n, device=device, dtype=dtype)[::2]
    y = torch.full((n,), float("nan"), device=device, dtype=dtype)
    Launch(scale_kernel, (triton_cdiv(n, 16),), stride_x=2, factor=3.0, BLOCK=16, SQUARE=True)(x, y, n)
    torch.testing.assert_close(y, (x.float() ** 2 * 3.0).to(dtype))


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Compiled:
    """What the JIT returns on a GPU: run(grid..., stream, function, metadata, ..., *args)."""

    def __init__(self, tag, calls):
        self.function, self.packed_metadata, self._calls = tag, tag, calls

    def run(self, gx, gy, gz, stream, function, metadata, launch_metadata, enter, leave, *args):
        self._calls.append(("direct", function, args))


class _Kernel:
    """A stand-in JIT function: compiles (records) a kernel per specialization key, as Triton would."""

    def __init__(self, real):
        self.fn = real.fn
        self.params = getattr(real, "params", None)
        self.kwargs = getattr(real, "kwargs", {})
        self.calls, self.compiles = [], []

    def __getitem__(self, grid):
        def jit(*args, **options):
            key = tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else a for a in args)
            self.compiles.append(key)
            self.calls.append(("jit", key, args))
            return _Compiled(key, self.calls)

        return jit


@pytest.fixture
def direct(monkeypatch):
    """Direct launches switched on with a fake current device (0, or what the test sets)."""
    state = {"device": 0}
    monkeypatch.setattr(launch_module, "DIRECT_LAUNCH", True)
    monkeypatch.setattr(launch_module, "_current_device", lambda: state["device"], raising=False)
    monkeypatch.setattr(launch_module, "_current_stream", lambda device: 0, raising=False)
    monkeypatch.setattr(launch_module, "_hooks_installed", lambda: False)
    state["contexts"] = []
    monkeypatch.setattr(launch_module, "_make_context_current", state["contexts"].append)
    return state


def test_second_call_is_direct_with_the_first_calls_compiled_kernel(direct):
    kernel = _Kernel(scale_kernel)
    launch = Launch(kernel, (1,), stride_x=1, factor=1.0, BLOCK=32)
    x, y = torch.zeros(8), torch.zeros(8)
    launch(x, y, 8)
    launch(x, y, 5)
    assert [c[0] for c in kernel.calls] == ["jit", "direct"]
    assert kernel.calls[1][2] == (x, y, 1, 5, 1.0, 32, False)


@pytest.mark.parametrize(
    "change",
    ["dtype", "alignment", "device", "none"],
)
def test_a_call_that_specializes_differently_never_takes_a_stale_kernel(direct, change):
    kernel = _Kernel(fill_kernel)
    launch = Launch(kernel, (1,), BLOCK=8)
    base = torch.zeros(16)
    launch(1.0, base)
    other = {
        "dtype": lambda: base.half(),
        "alignment": lambda: base[1:],
        "device": lambda: base,
        "none": lambda: None,
    }[change]()
    if change == "device":
        direct["device"] = 1
    launch(1.0, other)
    assert [c[0] for c in kernel.calls] == ["jit", "jit"]
    launch(1.0, other)
    assert kernel.calls[-1][0] == "direct" and kernel.calls[-1][1] == kernel.compiles[1]


def test_scalars_past_int32_go_through_the_jit(direct):
    kernel = _Kernel(scale_kernel)
    launch = Launch(kernel, (1,), stride_x=1, factor=1.0, BLOCK=32)
    x = torch.zeros(4)
    launch(x, x, 4)
    launch(x, x, 2**31)
    launch(x, x, 2**31)
    assert [c[0] for c in kernel.calls] == ["jit", "jit", "jit"]


def test_concurrent_calls_with_different_specializations_each_get_their_own_kernel(direct):
    kernel = _Kernel(fill_kernel)
    launch = Launch(kernel, (1,), BLOCK=8)
    outs = [torch.zeros(16, dtype=d) for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64)]
    barrier = threading.Barrier(len(outs))
    errors = []

    def work(out):
        try:
            barrier.wait()
            for _ in range(200):
                launch(1.0, out)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(out,)) for out in outs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(kernel.calls) == 200 * len(outs)
    for _, compiled_for, args in kernel.calls:
        assert compiled_for[1][0] == args[1].dtype, "a call ran a kernel compiled for another dtype"


def test_a_direct_launch_that_finds_no_context_makes_it_current_and_retries_once(direct):
    kernel = _Kernel(fill_kernel)
    launch = Launch(kernel, (1,), BLOCK=8)
    out = torch.zeros(16)
    launch(1.0, out)
    failures = iter([RuntimeError("Failed to create tensor map descriptor: invalid device context")])

    def run_once(*args):
        error = next(failures, None)
        if error is not None:
            raise error
        kernel.calls.append(("direct", args[4], args[9:]))

    entry = next(iter(launch._compiled.values()))
    launch._compiled = {key: (run_once, entry[1], entry[2]) for key in launch._compiled}
    launch(1.0, out)
    assert direct["contexts"] == [0, 0]  # once before the JIT's first launch, once for the retry
    assert [c[0] for c in kernel.calls] == ["jit", "direct"]


def test_a_launch_error_that_persists_is_raised(direct):
    kernel = _Kernel(fill_kernel)
    launch = Launch(kernel, (1,), BLOCK=8)
    out = torch.zeros(16)
    launch(1.0, out)

    def always_fails(*args):
        raise RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")

    launch._compiled = {key: (always_fails, *entry[1:]) for key, entry in launch._compiled.items()}
    with pytest.raises(RuntimeError, match="illegal memory access"):
        launch(1.0, out)


def test_making_the_context_current_never_queries_a_capturing_stream(monkeypatch):
    """A Launch's first call inside a CUDA-graph capture (its kernel compiled earlier through an
    autotuner, not through this Launch) goes through the JIT, which first makes the context
    current: a stream query there would invalidate the capture."""
    queried = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: queried.append(device))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    launch_module._make_context_current(0)
    assert queried == []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    with pytest.raises(AttributeError):  # the fake stream (None) has no query: the query was attempted
        launch_module._make_context_current(0)
    assert queried == [0]
