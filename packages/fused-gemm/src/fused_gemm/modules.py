"""nn.Module wrappers: a drop-in Linear with a fused activation, and the two-layer MLP built from it."""

from __future__ import annotations

from typing import Optional

import torch

from ._validation import check_activation
from .ops.matmul import matmul
from .ops.mlp import mlp


class Linear(torch.nn.Linear):
    """torch.nn.Linear with its activation fused into the matmul epilogue.

    Same arguments (plus `activation`), initialization, parameters (weight (out, in), bias (out,))
    and state_dict keys as torch.nn.Linear, of which it is a subclass. forward(x): x (..., in) ->
    act(x @ weight.T + bias) (..., out), through fused_gemm.matmul (the weight is read transposed
    in place, never copied).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        activation: Optional[str] = None,
        device=None,
        dtype=None,
    ):
        check_activation(activation)
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return matmul(x, self.weight.t(), self.bias, self.activation)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation!r}"


class MLP(torch.nn.Module):
    """fc2(act(fc1(x))): the transformer feed-forward block, each layer a fused Linear.

    Parameters fc1.weight (d_hidden, d_model), fc1.bias, fc2.weight (d_model, d_hidden), fc2.bias.
    forward is one fused_gemm.mlp call: the activation runs in fc1's epilogue, and its derivative
    in the epilogue of fc2's input gradient.
    """

    def __init__(
        self,
        d_model: int,
        d_hidden: int,
        activation: Optional[str] = "gelu",
        bias: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.fc1 = Linear(d_model, d_hidden, bias=bias, activation=activation, device=device, dtype=dtype)
        self.fc2 = Linear(d_hidden, d_model, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc1, fc2 = self.fc1, self.fc2
        return mlp(x, fc1.weight.t(), fc1.bias, fc2.weight.t(), fc2.bias, fc1.activation)
