"""The `host` group: microseconds per eager call at tiny shapes, where only the host path counts:
ours beside torch's own op and Liger-Kernel's (when importable), timed in turn in one run.
Forward with inputs that require grad (as in training); forward+backward through `.sum().backward()`."""

import functools

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit.bench import OURS, measure_host

from fused_norm_xent import cross_entropy, layer_norm, linear_cross_entropy, rms_norm

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

ROWS, COLS, VOCAB = 64, 1024, 1000


def _liger(name: str):
    try:
        import liger_kernel.transformers as liger
    except ImportError:
        return None
    return getattr(liger, name, None)


def _providers(ours, torch_op, liger_op, inputs):
    """Each op's forward call on `inputs` (Liger's where it is importable)."""
    ops = {OURS: ours, "torch": torch_op, "liger": liger_op}
    return {name: functools.partial(op, *inputs) for name, op in ops.items() if op is not None}


def _param(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_rms_norm(benchmark, mode):
    x, w = _param(ROWS, COLS), _param(COLS)
    liger_cls = _liger("LigerRMSNorm")
    liger = None
    if liger_cls is not None:
        module = liger_cls(COLS, eps=1e-6).to("cuda", torch.bfloat16)
        liger = lambda x, w: module(x)  # noqa: E731
    providers = _providers(
        lambda x, w: rms_norm(x, COLS, w, 1e-6), lambda x, w: F.rms_norm(x, (COLS,), w, 1e-6), liger, (x, w)
    )
    measure_host(benchmark, op="rms_norm", mode=mode, shape=f"{ROWS}x{COLS}", providers=providers)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_layer_norm(benchmark, mode):
    x, w, b = _param(ROWS, COLS), _param(COLS), _param(COLS)
    liger_cls = _liger("LigerLayerNorm")
    liger = None
    if liger_cls is not None:
        module = liger_cls(COLS, eps=1e-6).to("cuda", torch.bfloat16)
        liger = lambda x, w, b: module(x)  # noqa: E731
    providers = _providers(
        lambda x, w, b: layer_norm(x, COLS, w, b, 1e-6),
        lambda x, w, b: F.layer_norm(x, (COLS,), w, b, 1e-6),
        liger,
        (x, w, b),
    )
    measure_host(benchmark, op="layer_norm", mode=mode, shape=f"{ROWS}x{COLS}", providers=providers)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_cross_entropy(benchmark, mode):
    logits = _param(ROWS, VOCAB)
    target = torch.randint(0, VOCAB, (ROWS,), device="cuda")
    liger_cls = _liger("LigerCrossEntropyLoss")
    liger = None
    if liger_cls is not None:
        module = liger_cls()
        liger = lambda logits, target: module(logits, target)  # noqa: E731
    providers = _providers(cross_entropy, F.cross_entropy, liger, (logits, target))
    measure_host(benchmark, op="cross_entropy", mode=mode, shape=f"{ROWS}x{VOCAB}", providers=providers)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_linear_cross_entropy(benchmark, mode):
    hidden, weight = _param(ROWS, COLS), _param(VOCAB, COLS)
    target = torch.randint(0, VOCAB, (ROWS,), device="cuda")
    liger_cls = _liger("LigerFusedLinearCrossEntropyLoss")
    liger = None
    if liger_cls is not None:
        module = liger_cls()
        liger = lambda h, w, t: module(w, h, t)  # noqa: E731
    providers = _providers(
        linear_cross_entropy, lambda h, w, t: F.cross_entropy(F.linear(h, w), t), liger, (hidden, weight, target)
    )
    measure_host(benchmark, op="linear_cross_entropy", mode=mode, shape=f"{ROWS}x{COLS}x{VOCAB}", providers=providers)
