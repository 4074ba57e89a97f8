"""torch.compile(fullgraph=True) on every public function: no graph break (the launchers are
custom ops while Dynamo traces), same results and gradients as eager; opcheck on the ops."""

import pytest
import torch

import fused_norm_xent as nx
from fused_norm_xent._compat import HAS_CUSTOM_OP
from fused_norm_xent._runtime.dropout import dropout_rng

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.torch_compile,  # skipped with the reason beside a Triton 2.x (torch >= 2.3 needs triton.backends)
    pytest.mark.skipif(not HAS_CUSTOM_OP, reason="torch.library.custom_op needs torch >= 2.4"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
]


def _compare(fn, *tensors):
    """fn eager vs compiled (Dynamo + AOTAutograd, aot_eager backend, fullgraph): outputs and input gradients."""
    results = []
    for run in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        torch._dynamo.reset()
        inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
        out = run(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        total = sum(o.float().sum() for o in outs if o.requires_grad)
        grads = torch.autograd.grad(total, [t for t in inputs if t.requires_grad])
        results.append((outs, grads))
    (eager_out, eager_grads), (compiled_out, compiled_grads) = results
    for a, b in zip(eager_out + eager_grads, compiled_out + compiled_grads):
        torch.testing.assert_close(a, b, equal_nan=True)


def test_softmax(device):
    _compare(lambda x: (nx.softmax(x, 1), nx.log_softmax(x, -1)), torch.randn(4, 9, 33, device=device))


def test_norms(device):
    x, w, b = torch.randn(6, 40, device=device), torch.randn(40, device=device), torch.randn(40, device=device)
    _compare(lambda x, w, b: (nx.layer_norm(x, 40, w, b), nx.rms_norm(x, [40], w, offset=1.0)), x, w, b)
    _compare(lambda x, w, b: (nx.layer_norm(x, 40, w, b, out_dtype=torch.bfloat16),
                              nx.rms_norm(x, [40], w, out_dtype=torch.bfloat16)), x, w, b)  # fmt: skip


@pytest.mark.parametrize("prenorm", [True, False])
def test_add_dropout_norm(prenorm, device):
    x, residual, w = (
        torch.randn(5, 48, device=device),
        torch.randn(5, 48, device=device),
        torch.randn(48, device=device),
    )
    _compare(lambda x, r, w: nx.add_dropout_norm(x, r, w, None, 0.3, prenorm=prenorm, norm="rmsnorm", seed=21),
             x, residual, w)  # fmt: skip


@pytest.mark.parametrize("reduction, softcap", [("mean", 0.0), ("none", 0.0), ("mean", 2.0)])
def test_cross_entropy(reduction, softcap, device):
    logits, target = torch.randn(7, 30, device=device), torch.randint(0, 30, (7,), device=device)
    target[2] = -100
    _compare(lambda x, t: nx.cross_entropy(x, t, reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-3,
                                           softcap=softcap, return_z_loss=True), logits, target)  # fmt: skip


@pytest.mark.parametrize("reduction, softcap", [("sum", 0.0), ("none", 2.0)])
def test_linear_cross_entropy(reduction, softcap, device):
    hidden, weight, bias = (
        torch.randn(9, 8, device=device),
        torch.randn(20, 8, device=device),
        torch.randn(20, device=device),
    )
    target = torch.randint(0, 20, (9,), device=device)
    _compare(lambda h, w, b, t: nx.linear_cross_entropy(h, w, t, b, reduction=reduction, softcap=softcap, chunk_size=4),
             hidden, weight, bias, target)  # fmt: skip


def test_opcheck(device):
    """Schemas, fake (meta) implementations and autograd registrations of the forward ops."""
    ops = torch.ops.fused_norm_xent
    x, w = torch.randn(3, 16, device=device, requires_grad=True), torch.randn(16, device=device, requires_grad=True)
    torch.library.opcheck(ops.softmax_fwd, (x, 1, False))
    torch.library.opcheck(ops.norm_fwd, (x, w, None, [16], 1e-5, 0.0, False, None))
    torch.library.opcheck(ops.norm_fwd, (x, w, None, [16], 1e-5, 0.0, True, torch.bfloat16))
    residual = torch.randn(3, 16, device=device, requires_grad=True)
    rng = dropout_rng(x.device, 7, 0)  # the dropout's key words: the op itself draws nothing
    torch.library.opcheck(ops.add_dropout_norm_fwd, (x, residual, w, None, 1e-5, 0.0, True, 0.25, rng, False))
    logits, target = torch.randn(4, 10, device=device, requires_grad=True), torch.randint(0, 10, (4,), device=device)
    torch.library.opcheck(
        ops.cross_entropy_fwd, (logits, target, -100, 0.1, 0.0, 30.0, "mean", False, True, False, logits.dtype, False)
    )
    for h, weight_grad in ((x, "fp32"), (x.detach().bfloat16().requires_grad_(), "exact")):  # exact: vocabulary pass
        torch.library.opcheck(
            ops.linear_cross_entropy_fwd,
            (h, torch.randn(10, 16, device=device, dtype=h.dtype), None, target[:3], -100, 0.0, 0.0, 5.0, "sum", False,
             True, 2, weight_grad, h.dtype, h.dtype, False),
        )  # fmt: skip
