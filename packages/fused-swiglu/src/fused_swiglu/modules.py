"""nn.Module wrappers: SwiGLU (gate and up projections + activation) and SwiGLUMLP (+ down).

Weights are stored input-major, as the functions take them: `w_gate` and `w_up` are
(d_model, d_intermediate) and `w_down` is (d_intermediate, d_model), so that
y = (act(x @ w_gate) * (x @ w_up)) @ w_down, act silu (activation="silu", the default) or the
tanh-approximate GELU (activation="gelu_tanh": GeGLU, Gemma's MLP). An nn.Linear keeps the
transpose: to load a Hugging Face LLaMA (or Gemma) MLP, w_gate = gate_proj.weight.T,
w_up = up_proj.weight.T and w_down = down_proj.weight.T. The initialization is nn.Linear's:
every weight and bias is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = d_model for gate/up and
d_intermediate for down.
"""

from __future__ import annotations

import math

import torch

from ._validation import check_activation
from .ops.mlp import swiglu_mlp
from .ops.swiglu import swiglu


def _linear_init_(weight: torch.Tensor, bias) -> None:
    """nn.Linear.reset_parameters for an input-major (fan_in, fan_out) weight."""
    torch.nn.init.kaiming_uniform_(weight.t(), a=math.sqrt(5))  # fan_in = weight.t().shape[1]
    if bias is not None:
        bound = 1 / math.sqrt(weight.shape[0])
        torch.nn.init.uniform_(bias, -bound, bound)


class SwiGLU(torch.nn.Module):
    """act(x @ w_gate + b_gate) * (x @ w_up + b_up): (..., d_model) -> (..., d_intermediate).

    Parameters: w_gate, w_up (d_model, d_intermediate); with bias=True also b_gate, b_up
    (d_intermediate,). Inputs and parameters share one dtype (bf16, fp16 or fp32), or run under
    torch.autocast, which casts them as it casts nn.Linear's. activation: "silu" (SwiGLU) or
    "gelu_tanh" (GeGLU), checked here.
    """

    def __init__(
        self, d_model: int, d_intermediate: int, bias: bool = False, device=None, dtype=None, activation: str = "silu"
    ):
        super().__init__()
        check_activation(activation)
        factory = {"device": device, "dtype": dtype}
        self.d_model, self.d_intermediate, self.activation = d_model, d_intermediate, activation
        self.w_gate = torch.nn.Parameter(torch.empty(d_model, d_intermediate, **factory))
        self.w_up = torch.nn.Parameter(torch.empty(d_model, d_intermediate, **factory))
        if bias:
            self.b_gate = torch.nn.Parameter(torch.empty(d_intermediate, **factory))
            self.b_up = torch.nn.Parameter(torch.empty(d_intermediate, **factory))
        else:
            self.register_parameter("b_gate", None)
            self.register_parameter("b_up", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _linear_init_(self.w_gate, self.b_gate)
        _linear_init_(self.w_up, self.b_up)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.w_gate, self.w_up, self.b_gate, self.b_up, self.activation)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_intermediate={self.d_intermediate}, bias={self.b_gate is not None}, "
            f"activation={self.activation!r}"
        )


class SwiGLUMLP(SwiGLU):
    """LLaMA-style MLP: SwiGLU then the down projection, (..., d_model) -> (..., d_model).

    Parameters: those of SwiGLU, plus w_down (d_intermediate, d_model) and, with bias=True,
    b_down (d_model,). The down projection's backward runs with the SwiGLU backward fused into
    it (see fused_swiglu.ops.mlp).
    """

    def __init__(
        self, d_model: int, d_intermediate: int, bias: bool = False, device=None, dtype=None, activation: str = "silu"
    ):
        factory = {"device": device, "dtype": dtype}
        w_down = torch.nn.Parameter(torch.empty(d_intermediate, d_model, **factory))
        b_down = torch.nn.Parameter(torch.empty(d_model, **factory)) if bias else None
        super().__init__(d_model, d_intermediate, bias, device, dtype, activation)
        self.w_down = w_down
        self.b_down = b_down
        _linear_init_(self.w_down, self.b_down)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "w_down"):
            _linear_init_(self.w_down, self.b_down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu_mlp(
            x, self.w_gate, self.w_up, self.w_down, self.b_gate, self.b_up, self.b_down, activation=self.activation
        )
