"""Pure-PyTorch references; the tests and benchmarks compare against these.

`swiglu_reference` / `swiglu_mlp_reference` (activation "silu" or "gelu_tanh", as the package's
functions) compute in the dtype of their inputs: called on float64 copies they are the
high-precision reference, called on the bf16/fp16 inputs they are PyTorch's own low-precision
twin (what the project's tolerance rule compares against).

`fp16_accumulate_matmul` is the low-precision twin of an fp16-accumulating matmul, which
PyTorch does not have: a model of tensor-core fp16 accumulation. Each 16-wide chunk of the
reduction (one MMA k-step) is summed exactly (products of fp16 values are exact, and so is
their sum of 16 in float64), then added to an fp16 accumulator with one rounding, either to
nearest or toward zero: published measurements of NVIDIA tensor cores differ by generation and
mode on that last rounding, so the tests take whichever of the two models errs more.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

MMA_K = 16  # reduction elements one tensor-core MMA step sums before touching the accumulator
ROUNDINGS = ("nearest", "toward_zero")
# The gate's activations by name, as torch eager computes them.
ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda g: F.gelu(g, approximate="tanh")}


def swiglu_reference(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    b_gate: Optional[torch.Tensor] = None,
    b_up: Optional[torch.Tensor] = None,
    activation: str = "silu",
) -> torch.Tensor:
    """act(x @ w_gate + b_gate) * (x @ w_up + b_up), in the inputs' dtype, as torch eager does it."""
    gate = x @ w_gate if b_gate is None else x @ w_gate + b_gate
    up = x @ w_up if b_up is None else x @ w_up + b_up
    return ACTIVATIONS[activation](gate) * up


def swiglu_mlp_reference(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    b_gate: Optional[torch.Tensor] = None,
    b_up: Optional[torch.Tensor] = None,
    b_down: Optional[torch.Tensor] = None,
    activation: str = "silu",
) -> torch.Tensor:
    """swiglu_reference(...) @ w_down + b_down, in the inputs' dtype."""
    y = swiglu_reference(x, w_gate, w_up, b_gate, b_up, activation) @ w_down
    return y if b_down is None else y + b_down


def round_to_fp16(values: torch.Tensor, rounding: str) -> torch.Tensor:
    """float64 values rounded to fp16 ('nearest', ties to even, or 'toward_zero'), kept as float64."""
    if rounding == "nearest":
        return values.to(torch.float16).to(torch.float64)
    if rounding != "toward_zero":
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    _, exponent = torch.frexp(values)
    # fp16 keeps 11 significant bits; below 2^-14 (subnormals) the quantum is 2^-24.
    quantum = torch.ldexp(torch.ones_like(values), exponent.clamp_min(-13) - 11)
    truncated = torch.trunc(values / quantum) * quantum
    return truncated.clamp(-65504.0, 65504.0).where(values.isfinite(), values)


def fp16_accumulate_matmul(a: torch.Tensor, b: torch.Tensor, rounding: str = "nearest") -> torch.Tensor:
    """a (M, R) @ b (R, N) of fp16 values, accumulated in fp16 as tensor cores do; returns fp16.

    Each MMA_K-wide chunk of R is summed exactly, then added into the fp16 accumulator with one
    rounding (`rounding`: 'nearest' or 'toward_zero').
    """
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
    for start in range(0, a.shape[1], MMA_K):
        acc = round_to_fp16(acc + a64[:, start : start + MMA_K] @ b64[start : start + MMA_K], rounding)
    return acc.to(torch.float16)


def swiglu_fp16_accumulate_reference(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, dh: torch.Tensor, rounding: str = "nearest"
):
    """FastAccumFusedSwiGLU with fp16_accumulate=True, modelled on fp16 (M, K) x, (K, N) weights, (M, N) dh.

    Returns (h, dx, dw_gate, dw_up) in fp16. As the kernels: g and u are fp16-accumulated and
    stored as fp16; h = silu(g) * u and d_gate, d_up are formed in fp32 and stored as fp16;
    dx = [d_gate, d_up] @ [w_gate, w_up]^T accumulates in fp16; the weight gradients
    x^T @ d_gate, x^T @ d_up accumulate in fp32 (modelled exact, then rounded once).
    """
    gate = fp16_accumulate_matmul(x, w_gate, rounding).float()
    up = fp16_accumulate_matmul(x, w_up, rounding).float()
    sig = torch.sigmoid(gate)
    h = (gate * sig * up).half()
    dh = dh.float()
    d_gate = (dh * up * sig * (1 + gate * (1 - sig))).half()
    d_up = (dh * gate * sig).half()
    dx = fp16_accumulate_matmul(torch.cat([d_gate, d_up], 1), torch.cat([w_gate.t(), w_up.t()], 0), rounding)
    x64 = x.double().t()
    return h, dx, (x64 @ d_gate.double()).half(), (x64 @ d_up.double()).half()
