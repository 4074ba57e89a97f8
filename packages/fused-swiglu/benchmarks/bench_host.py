"""The `host` group: microseconds per eager call at a tiny shape, where only the host path counts:
ours beside the MLP in torch and with Liger-Kernel's SiLU-mul (when importable), timed in turn in
one run. Forward with inputs that require grad (as in training); forward+backward through
`.sum().backward()`."""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit.bench import OURS, measure_host

from fused_swiglu import swiglu_mlp

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

M, D, I = 64, 1024, 2816  # noqa: E741


def _param(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_swiglu_mlp(benchmark, mode):
    x, w_gate, w_up, w_down = _param(M, D), _param(D, I), _param(D, I), _param(I, D)
    fns = {
        OURS: lambda: swiglu_mlp(x, w_gate, w_up, w_down),
        "torch": lambda: (F.silu(x @ w_gate) * (x @ w_up)) @ w_down,
    }
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        fns["liger"] = lambda: LigerSiLUMulFunction.apply(x @ w_gate, x @ w_up) @ w_down
    except ImportError:
        pass

    measure_host(benchmark, op="swiglu_mlp", mode=mode, shape=f"{M}x{D}->{I}",
                 providers=fns)  # fmt: skip
