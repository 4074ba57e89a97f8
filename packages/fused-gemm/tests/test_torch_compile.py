"""torch.compile(fullgraph=True) traces matmul, bmm and the modules without a graph break.

The launchers are torch custom ops (torch >= 2.4) with fake implementations, called from the
autograd.Function; backend="eager" runs the traced graph with the same kernels, so it also runs
on the CPU under the interpreter.
"""

import pytest
import torch

from fused_gemm import MLP, bmm, matmul
from fused_gemm._runtime.compat import HAS_CUSTOM_OP

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.torch_compile,
    pytest.mark.skipif(not HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op: no fullgraph tracing"),
]


def _grads(fn, *inputs):
    inputs = [t.detach().requires_grad_() for t in inputs]
    y = fn(*inputs)
    dy = torch.ones_like(y)
    return (y, *torch.autograd.grad(y, inputs, dy))


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_matmul_and_bmm_compile_fullgraph(activation, device):
    torch._dynamo.reset()
    x = torch.randn(2, 9, 32, device=device, dtype=torch.bfloat16)
    w = (torch.randn(24, 32, device=device) / 32**0.5).to(torch.bfloat16).t()
    b = torch.randn(24, device=device, dtype=torch.bfloat16)

    def linear(x, w, b):
        return matmul(x, w, b, activation)

    compiled = torch.compile(linear, backend="eager", fullgraph=True)
    for eager, traced in zip(_grads(linear, x, w, b), _grads(compiled, x, w, b)):
        assert torch.equal(eager, traced)

    def batched(a, c):
        return bmm(a, c.transpose(1, 2), activation=activation)

    compiled = torch.compile(batched, backend="eager", fullgraph=True)
    for eager, traced in zip(_grads(batched, x, x), _grads(compiled, x, x)):
        assert torch.equal(eager, traced)


def test_mlp_module_compiles_fullgraph(device):
    torch._dynamo.reset()
    mlp = MLP(32, 64, device=device)
    compiled = torch.compile(mlp, backend="eager", fullgraph=True)
    x = torch.randn(3, 7, 32, device=device)
    y_eager = mlp(x)
    y_eager.sum().backward()
    grads_eager = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    y = compiled(x)
    y.sum().backward()
    assert torch.equal(y, y_eager)
    for g, e in zip((p.grad for p in mlp.parameters()), grads_eager):
        assert torch.equal(g, e)


def test_the_traced_graph_calls_the_custom_ops(device):
    """Dynamo records the launchers as the opaque ops fused_gemm::gemm_fwd / gemm_bwd (not traced into)."""
    torch._dynamo.reset()
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm.print_readable(print_output=False))
        return gm.forward

    x = torch.randn(8, 32, device=device, requires_grad=True)
    w = torch.randn(32, 16, device=device, requires_grad=True)
    compiled = torch.compile(lambda x, w: matmul(x, w, None, "gelu"), backend=recording_backend, fullgraph=True)
    compiled(x, w).sum().backward()
    code = "\n".join(graphs)
    assert "torch.ops.fused_gemm.gemm_fwd.default" in code and "torch.ops.fused_gemm.gemm_bwd.default" in code
