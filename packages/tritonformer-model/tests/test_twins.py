"""Transformer (kernel packages) against TorchTransformer (plain PyTorch) from one state_dict.

Component by component as the kernels land, then the whole model: logits, loss and every
gradient, for each option combination, under the project's rule (error against float64 at
most 2x PyTorch's own in the same precision). Tiny shapes: these run in the interpreter.
"""

import pytest
import torch
from tritonformer_testkit import dtype_params

from tritonformer import TransformerConfig, model, torch_model

pytestmark = pytest.mark.kernels


def tiny(**options) -> TransformerConfig:
    base = dict(vocab_size=256, n_layer=2, n_head=4, d_model=32, max_seq_len=32)
    return TransformerConfig(**{**base, **options})


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("dtype", dtype_params())
def test_swiglu_mlp(bias, dtype, device, check_twins):
    config = tiny(mlp="swiglu", d_ff=80, use_linear_bias=bias)
    reference = torch_model.SwiGLUMLP(config).to(device)
    for p in reference.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    ours = model.SwiGLUMLP(config).to(device)
    check_twins(ours, reference, [torch.randn(2, 7, 32, device=device)], dtype)
