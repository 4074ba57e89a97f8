"""Concurrent calls from several threads: plans and tuned launches are published whole, so a thread
never sees another's half-built entry, and every call gets its own correct result.

Under the interpreter, Triton keeps the running program's id and its patched `triton.language` in
process-wide state, so two interpreted kernels cannot overlap: the test kit's fixture
`one_interpreted_kernel_at_a_time` runs kernel bodies one at a time while everything around them
(checks, plans, tuning, caches, launch assembly) runs concurrently. Compiled, kernels launch concurrently as they are.
"""

from __future__ import annotations

import threading

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, run_in_threads

from fused_gemm import matmul
from fused_gemm._compat import supports_tma
from fused_gemm.kernels.matmul import _matmul_kernel
from fused_gemm.kernels.matmul_tma import _matmul_tma_kernel
from fused_gemm.ops import launch
from fused_gemm.reference import matmul_reference

pytestmark = pytest.mark.kernels

# Each thread's wait for the others; far above what these small problems take.
TIMEOUT_S = 120


def _operands(m, k, n, dtype, device):
    x = torch.randn(m, k, device=device).to(dtype)
    w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype).t()
    b = torch.randn(n, device=device).to(dtype)
    return x, w, b


@pytest.mark.usefixtures("one_interpreted_kernel_at_a_time")
def test_threads_with_different_shapes_all_get_their_results(device):
    """Four threads, each its own shape (new plans, tuned concurrently), forward and backward twice
    (the second call reuses what the first published). Each thread's results equal, bit for bit,
    the same call made alone afterwards, which is accurate. The operands are drawn before the
    threads start: drawn inside them, the order of the draws (and so the inputs) would vary."""
    shapes = [(9, 24, 16), (17, 40, 24), (33, 16, 40), (5, 48, 8)]
    problems = []
    for m, k, n in shapes:
        leaves = [t.requires_grad_() for t in _operands(m, k, n, torch.float32, device)]
        problems.append((leaves, torch.randn(m, n, device=device)))

    def call(i):
        leaves, dy = problems[i]
        y = matmul(*leaves, "gelu")
        return (y.detach(), *torch.autograd.grad(y, leaves, dy))

    results = [None] * len(shapes)

    def work(i):
        results[i] = [call(i) for _ in range(2)]

    assert run_in_threads(work, len(shapes)) == [None] * len(shapes)
    for i, (leaves, dy) in enumerate(problems):
        alone = call(i)
        for outputs in results[i]:
            for name, got, expected in zip(("y", "dx", "dw", "dbias"), outputs, alone):
                torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=f"{name} of thread {i}")
        ref = [t.detach().double().requires_grad_() for t in leaves]
        y_ref = matmul_reference(*ref, "gelu")
        refs = (y_ref.detach(), *torch.autograd.grad(y_ref, ref, dy.double()))
        low = [t.detach().requires_grad_() for t in leaves]
        y_low = matmul_reference(*low, "gelu")
        lows = (y_low.detach(), *torch.autograd.grad(y_low, low, dy))
        for name, got, expected, twin in zip(("y", "dx", "dw", "dbias"), alone, refs, lows):
            assert_close_to_reference(got, expected, twin, name=name)


@pytest.mark.parametrize("path", ["portable", "tma"])
def test_a_thread_arriving_while_another_tunes_the_same_plan(
    path, device, one_interpreted_kernel_at_a_time, monkeypatch
):
    """The first thread is held inside its tuning (while it turns the chosen config into a launch);
    a second thread launches the same problem meanwhile. It must not find a half-tuned entry
    (a plan whose config was set but not yet its grid or launch): it tunes for itself, and both
    results are right."""
    if path == "tma" and not supports_tma(torch.device(device)):
        pytest.skip("the TMA kernel needs Triton >= 3.4 and a Hopper GPU (or the Triton 3.x interpreter)")
    kernel = _matmul_tma_kernel if path == "tma" else _matmul_kernel
    monkeypatch.setattr(kernel, "configs", list(kernel.configs))  # a fresh list: this problem tunes anew
    inside, finished = threading.Event(), threading.Event()
    held = []
    real = launch.launch_options

    def held_once(config):
        if not held:
            held.append(threading.current_thread())
            inside.set()
            finished.wait(TIMEOUT_S)
        return real(config)

    monkeypatch.setattr(launch, "launch_options", held_once)
    m, k, n, dtype = 20, 32, 24, torch.bfloat16
    a = torch.randn(1, m, k, device=device).to(dtype)
    b = (torch.randn(1, n, k, device=device) * k**-0.5).to(dtype).transpose(1, 2)
    bias = torch.randn(n, device=device).to(dtype)
    outs = [torch.full((1, m, n), float("nan"), device=device, dtype=dtype) for _ in range(2)]

    def work(i):
        if i == 1:
            assert inside.wait(TIMEOUT_S), "the first thread never reached its tuning"
        try:
            launch.launch_matmul(a, b, outs[i], bias=bias, activation=2, path=path)
        finally:
            if i == 1:
                finished.set()

    assert run_in_threads(work, 2) == [None, None]
    assert held, "the tuning step was never reached"
    z64 = torch.bmm(a.double(), b.double()) + bias.double()
    expected = torch.nn.functional.gelu(z64)
    low = torch.nn.functional.gelu(torch.bmm(a, b) + bias)
    for out in outs:
        assert_close_to_reference(out, expected, low, name="c")
