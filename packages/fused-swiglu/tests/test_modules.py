"""SwiGLU and SwiGLUMLP modules: parameters, nn.Linear's initialization, forward = the functions."""

import math

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference

from fused_swiglu import SwiGLU, SwiGLUMLP
from fused_swiglu.reference import swiglu_mlp_reference, swiglu_reference


def test_parameter_names_and_shapes():
    module = SwiGLUMLP(24, 40, bias=True)
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
    assert shapes == {
        "w_gate": (24, 40),
        "w_up": (24, 40),
        "b_gate": (40,),
        "b_up": (40,),
        "w_down": (40, 24),
        "b_down": (24,),
    }
    assert {name for name, _ in SwiGLU(24, 40).named_parameters()} == {"w_gate", "w_up"}
    assert SwiGLU(24, 40).b_gate is None and SwiGLUMLP(24, 40).b_down is None
    assert repr(SwiGLUMLP(24, 40)) == "SwiGLUMLP(d_model=24, d_intermediate=40, bias=False, activation='silu')"
    gelu = SwiGLU(24, 40, activation="gelu_tanh")
    assert gelu.activation == "gelu_tanh" and repr(gelu).endswith("activation='gelu_tanh')")


def test_factory_arguments():
    module = SwiGLUMLP(8, 16, bias=True, dtype=torch.bfloat16, device="cpu")
    assert all(p.dtype == torch.bfloat16 and p.device.type == "cpu" for p in module.parameters())


@pytest.mark.parametrize(
    "name, fan_in", [("w_gate", 256), ("w_up", 256), ("b_gate", 256), ("w_down", 512), ("b_down", 512)]
)
def test_initialization_is_nn_linear(name, fan_in):
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) as nn.Linear: the bound holds and the spread fills it."""
    module = SwiGLUMLP(256, 512, bias=True)
    values = getattr(module, name).detach().flatten()
    bound = 1 / math.sqrt(fan_in)
    assert float(values.abs().max()) <= bound
    # uniform on [-b, b] has std b / sqrt(3); with >= 256 samples the estimate is within ~10%.
    assert abs(float(values.std()) / (bound / math.sqrt(3)) - 1) < 0.15
    assert abs(float(values.mean())) < 0.2 * bound


def test_reset_parameters_redraws_everything():
    module = SwiGLUMLP(16, 32, bias=True)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    module.reset_parameters()
    assert all(not torch.equal(before[n], p) for n, p in module.named_parameters())


@pytest.mark.kernels
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_modules_compute_the_reference(bias, activation, device):
    x = torch.randn(2, 7, 32, device=device, dtype=torch.bfloat16)
    for module_class, reference in ((SwiGLU, swiglu_reference), (SwiGLUMLP, swiglu_mlp_reference)):
        module = module_class(32, 48, bias=bias, device=device, dtype=torch.bfloat16, activation=activation)
        params = [p for p in (module.w_gate, module.w_up, getattr(module, "w_down", None)) if p is not None]
        if bias:
            params += [module.b_gate, module.b_up] + ([module.b_down] if module_class is SwiGLUMLP else [])
        y = module(x)
        y.float().square().sum().backward()
        assert all(p.grad is not None and p.grad.shape == p.shape for p in module.parameters())
        expected = reference(x.double(), *(p.detach().double() for p in params), activation=activation)
        low = reference(x, *(p.detach() for p in params), activation=activation)
        assert_close_to_reference(y, expected, low, name=module_class.__name__)
