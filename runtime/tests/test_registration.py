"""eager_function_apply: the C++ apply of an autograd.Function for eager calls, torch's own
apply where torch.compile traces or a functorch transform runs."""

from __future__ import annotations

import pytest
import torch

from kernel_runtime import registration
from kernel_runtime.registration import eager_function_apply


class Scale(torch.autograd.Function):
    """y = x * factor with a backward that counts its calls (what the tests look at)."""

    backward_calls = 0

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x * factor

    @staticmethod
    def backward(ctx, dy):
        Scale.backward_calls += 1
        return dy * ctx.factor, None


scale = eager_function_apply(Scale)


def test_eager_calls_record_the_same_graph_as_torch_apply():
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = scale(x, 3.0)
    assert y.grad_fn is not None and type(y.grad_fn).__name__ == "ScaleBackward"
    before = Scale.backward_calls
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert Scale.backward_calls == before + 1
    torch.testing.assert_close(grad, torch.full_like(x, 3.0), rtol=0, atol=0)


def test_eager_calls_skip_the_python_layer(monkeypatch):
    monkeypatch.setattr(Scale, "apply", lambda *args: pytest.fail("torch's Python apply ran"))
    scale(torch.randn(3, requires_grad=True), 2.0)


def test_a_functorch_transform_takes_torch_apply():
    """torch's apply runs under vmap (and refuses a Function without setup_context, as it always has)."""
    with pytest.raises(RuntimeError, match="it must override the setup_context staticmethod"):
        torch.func.vmap(lambda row: scale(row, 2.0))(torch.randn(4, 3))


def test_while_torch_compile_traces_torch_apply_runs(monkeypatch):
    called = []
    original = Scale.apply
    monkeypatch.setattr(Scale, "apply", lambda *args: called.append(1) or original(*args))
    monkeypatch.setattr(registration, "is_compiling", lambda: True)
    scale(torch.randn(3, requires_grad=True), 2.0)
    assert called
