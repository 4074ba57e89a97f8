"""Every autotune config of every kernel, compiled and run once (the other tests pin one per
kernel: conftest.py). Config index i of each kernel's list (its last where the list is shorter),
bf16, on odd dims at 1000 rows (d_model 1000): the MLP at d_intermediate 2760 (16-byte rows: the
TMA kernels on a Hopper; the weight gradient's last wave splits for most tiles) and SwiGLU at 2730 (unaligned rows:
the pointer forward and weight gradients and the elementwise gradient)."""

import pytest
import torch
from tritonformer_testkit import interpreting

from fused_swiglu import swiglu, swiglu_mlp
from fused_swiglu.kernels import configs
from fused_swiglu.reference import swiglu_mlp_reference, swiglu_reference

pytestmark = pytest.mark.kernels

CONFIG_LISTS = (
    configs.forward_configs,
    configs.forward_tma_configs,
    configs.down_grad_configs,
    configs.down_grad_tma_configs,
    configs.input_grad_configs,
    configs.input_grad_tma_configs,
    configs.weight_grad_configs,
    configs.weight_grad_tma_configs,
)
MOST_CONFIGS = max(len(make()) for make in CONFIG_LISTS)


@pytest.mark.parametrize("index", range(MOST_CONFIGS), ids=lambda i: f"config{i}")
def test_every_config(index, sw, monkeypatch):
    if interpreting():
        pytest.skip("the interpreter runs one config per kernel (kernels/configs.py); every config runs compiled")
    sw.pin_configs(monkeypatch, index)
    x, w_gate, w_up = sw.make_inputs((2, 500), 1000, 2760, torch.bfloat16, "cuda")
    w_down = sw.linear_weight(2760, 1000, "cuda", torch.bfloat16).requires_grad_()
    sw.check_against_reference(swiglu_mlp, swiglu_mlp_reference, [x, w_gate, w_up, w_down])
    sw.check_against_reference(swiglu, swiglu_reference, sw.make_inputs((1000,), 1000, 2730, torch.bfloat16, "cuda"))
