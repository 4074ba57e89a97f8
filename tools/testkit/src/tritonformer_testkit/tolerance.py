"""The project's tolerance rule (docs/ARCHITECTURE.md, correctness policy).

A kernel's error against the high-precision reference must be at most `factor` (2) times the
error of the same PyTorch computation run in the kernel's low precision, plus a small atol.
Non-finite values must sit where the reference has them: NaN where it has NaN, inf of the
same sign where it has inf.

Triton's interpreter truncates fp32 -> bf16 casts instead of rounding them, so
when interpreting, a bf16 result may also be off by one bf16 ulp of the reference value.
"""

from __future__ import annotations

from typing import Optional

import torch

from .runtime import interpreting

# The small absolute slack on top of 2x PyTorch's own error: a few units in the last place at
# the magnitude of a normalized output, so that a case where PyTorch happens to be exact does
# not demand exactness from a kernel that rounds in another order.
DEFAULT_ATOL = {
    torch.float64: 1e-12,
    torch.float32: 1e-6,
    torch.float16: 2e-4,
    torch.bfloat16: 2e-3,
}


def _bf16_ulp(reference: torch.Tensor) -> torch.Tensor:
    """One bf16 unit in the last place at each |reference| (8 significand bits)."""
    _, exponent = torch.frexp(reference.abs().clamp_min(torch.finfo(torch.bfloat16).tiny))
    return torch.ldexp(torch.ones_like(reference), exponent - 8)


def _max_abs_error(x: torch.Tensor, reference: torch.Tensor, finite: torch.Tensor) -> float:
    if not bool(finite.any()):
        return 0.0
    return float((x.double() - reference)[finite].abs().max())


def _check_non_finite(actual: torch.Tensor, reference: torch.Tensor, name: str) -> None:
    """NaN where the reference has NaN, inf of the same sign where it has inf."""
    ref_nan, act_nan = reference.isnan(), actual.isnan()
    if not torch.equal(ref_nan, act_nan):
        missing = int((ref_nan & ~act_nan).sum())
        extra = int((act_nan & ~ref_nan).sum())
        raise AssertionError(
            f"{name}: NaN positions differ from the reference ({extra} NaN where the reference has "
            f"none, e.g. an unwritten element; {missing} missing where the reference has NaN)"
        )
    ref_inf = reference.isinf()
    if not torch.equal(ref_inf, actual.isinf()) or not torch.equal(reference[ref_inf], actual[ref_inf].double()):
        raise AssertionError(f"{name}: inf positions or signs differ from the reference")


def _checked_pair(actual: torch.Tensor, reference: torch.Tensor, atol: Optional[float], name: str):
    """(actual on the CPU, reference in float64 on the CPU, atol or actual's default), after the
    checks both rules share: equal shapes, non-finite values where the reference has them."""
    if actual.shape != reference.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != reference {tuple(reference.shape)}")
    actual = actual.detach().cpu()
    reference = reference.detach().cpu().double()
    _check_non_finite(actual, reference, name)
    return actual, reference, DEFAULT_ATOL[actual.dtype] if atol is None else atol


def assert_close_to_reference(
    actual: torch.Tensor,
    reference: torch.Tensor,
    torch_lowp: Optional[torch.Tensor] = None,
    *,
    atol: Optional[float] = None,
    factor: float = 2.0,
    name: str = "output",
) -> None:
    """Assert that `actual` is as close to `reference` as PyTorch in low precision is.

    actual: the kernel's result, any floating dtype.
    reference: the same computation in float32 or float64 on upcast inputs.
    torch_lowp: PyTorch's own result computed in `actual`'s dtype (None: the bound is atol alone).
    atol: absolute slack added to the bound; by default DEFAULT_ATOL[actual.dtype].
    """
    actual, reference, atol = _checked_pair(actual, reference, atol, name)
    finite = reference.isfinite()
    kernel_error = _max_abs_error(actual, reference, finite)
    torch_error = 0.0
    if torch_lowp is not None:
        torch_lowp = torch_lowp.detach().cpu()
        torch_error = _max_abs_error(torch_lowp, reference, finite & torch_lowp.isfinite())
    bound = factor * torch_error + atol
    error = (actual.double() - reference).abs().where(finite, torch.zeros((), dtype=torch.float64))
    truncation = _bf16_ulp(reference) if interpreting() and actual.dtype == torch.bfloat16 else 0.0
    excess = error - truncation - bound
    if not bool((excess <= 0).all()):
        worst = int(excess.argmax())
        allowance = "" if isinstance(truncation, float) else " + one bf16 ulp (interpreter truncation)"
        raise AssertionError(
            f"{name} ({actual.dtype}): max abs error {kernel_error:.3e} > bound {bound:.3e} "
            f"(= {factor} x PyTorch's {torch_error:.3e} + atol {atol:.1e}){allowance}; worst at flat index "
            f"{worst}: got {actual.flatten()[worst].item():.6g}, reference {reference.flatten()[worst].item():.6g}"
        )


def assert_rms_close_to_reference(
    actual: torch.Tensor,
    reference: torch.Tensor,
    torch_lowp: torch.Tensor,
    *,
    atol: Optional[float] = None,
    factor: float = 2.0,
    name: str = "output",
) -> None:
    """The same rule on the root-mean-square error: for results of long chains of kernels (a
    whole model's parameter gradients), where the largest error of a small tensor is one draw of
    an extreme-value statistic. Measured on the H100 (tiny GPT-2 and Llama twins, bf16 autocast,
    8 seeds): per parameter the max-error ratio to PyTorch had medians 0.83-1.24 but single
    draws up to 2.01; the RMS error averages the draw out and still exposes a systematic excess."""
    actual, reference, atol = _checked_pair(actual, reference, atol, name)
    torch_lowp = torch_lowp.detach().cpu()
    finite = reference.isfinite() & torch_lowp.isfinite()
    if not bool(finite.any()):
        return
    kernel_rms = float((actual.double() - reference)[finite].square().mean().sqrt())
    torch_rms = float((torch_lowp.double() - reference)[finite].square().mean().sqrt())
    bound = factor * torch_rms + atol
    if kernel_rms > bound:
        raise AssertionError(
            f"{name} ({actual.dtype}): RMS error {kernel_rms:.3e} > bound {bound:.3e} "
            f"(= {factor} x PyTorch's {torch_rms:.3e} + atol {atol:.1e})"
        )
