"""Linear and MLP: drop-in for torch.nn.Linear (arguments, initialization, state_dict), numerics as matmul."""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit import assert_close_to_reference

from fused_gemm import MLP, Linear
from fused_gemm.reference import activation_reference


def test_linear_is_an_nn_linear_with_the_same_state():
    torch.manual_seed(0)
    ours = Linear(24, 40, bias=True, activation="gelu")
    torch.manual_seed(0)
    theirs = torch.nn.Linear(24, 40, bias=True)
    assert isinstance(ours, torch.nn.Linear)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "bias"]
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    assert repr(ours) == "Linear(in_features=24, out_features=40, bias=True, activation='gelu')"
    assert list(Linear(4, 5, bias=False).state_dict()) == ["weight"]
    ours.load_state_dict(theirs.state_dict())


def test_linear_dtype_and_device_arguments():
    layer = Linear(8, 16, activation="relu", device="meta", dtype=torch.bfloat16)
    assert layer.weight.shape == (16, 8) and layer.weight.dtype == torch.bfloat16 and layer.weight.is_meta


def test_linear_rejects_unknown_activation():
    with pytest.raises(ValueError, match=r"^activation='swish' is not supported"):
        Linear(4, 4, activation="swish")


def test_mlp_parameter_names():
    mlp = MLP(16, 64)
    names = {name: tuple(p.shape) for name, p in mlp.named_parameters()}
    assert names == {"fc1.weight": (64, 16), "fc1.bias": (64,), "fc2.weight": (16, 64), "fc2.bias": (16,)}
    assert mlp.fc1.activation == "gelu" and mlp.fc2.activation is None
    assert list(MLP(16, 64, bias=False).state_dict()) == ["fc1.weight", "fc2.weight"]


@pytest.mark.kernels
@pytest.mark.parametrize("activation", ["gelu", "relu", "gelu_tanh"])
def test_linear_and_mlp_match_torch(activation, device):
    """Outputs and parameter gradients against torch's own modules in float64 (bound: torch in fp32)."""
    mlp = MLP(24, 40, activation=activation, device=device)
    x = torch.randn(2, 9, 24, device=device, requires_grad=True)
    dy = torch.randn(2, 9, 24, device=device)

    def torch_mlp(x, params):
        h = activation_reference(F.linear(x, params["fc1.weight"], params["fc1.bias"]), activation)
        return F.linear(h, params["fc2.weight"], params["fc2.bias"])

    y = mlp(x)
    grads = torch.autograd.grad(y, [x, *mlp.parameters()], dy)
    results = {}
    for dtype in (torch.float64, torch.float32):
        params = {k: v.detach().to(dtype).requires_grad_() for k, v in mlp.named_parameters()}
        xd = x.detach().to(dtype).requires_grad_()
        yd = torch_mlp(xd, params)
        results[dtype] = (yd, torch.autograd.grad(yd, [xd, *params.values()], dy.to(dtype)))
    (y64, g64), (y32, g32) = results[torch.float64], results[torch.float32]
    assert_close_to_reference(y, y64, y32, name="y")
    for name, g, r, t in zip(["x", *dict(mlp.named_parameters())], grads, g64, g32):
        assert_close_to_reference(g, r, t, name=f"d{name}")
