"""Launches of one kernel that go through Triton's JIT once per specialization, then directly.

A RoPE forward is tens to hundreds of microseconds of GPU time, and Triton's JIT spends a few
tens of microseconds of host time per launch binding and specializing the arguments. A launch
here names its arguments in three groups: the tensors, the integers the JIT specializes on
(strides: their divisibility by 16 and equality to 1 shape the compiled code), and the
runtime integers the kernel declares `do_not_specialize` (sizes, the direction). The first two
(tensors by dtype and 16-byte alignment, integers by value) plus the launch plan make the key
under which the compiled kernel of the first launch is kept; a later launch with the same key
calls it directly (`_compat.direct_launcher`, Triton 3.4-3.9). Runtime integers are assumed
to fit in int32, as they do for any tensor whose sizes do.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from .._compat import DIRECT_LAUNCH, direct_launcher
from .config import LaunchPlan

# Keys kept per kernel before the table is cleared (a training run meets a handful).
MAX_KEYS = 512
_MISSING = object()


class KernelLaunches:
    """Launches of `kernel` (a @triton.jit function), with its compiled kernels' launchers by key."""

    __slots__ = ("kernel", "launchers")

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.launchers: Dict[Tuple[Any, ...], Any] = {}

    def __call__(
        self,
        plan: LaunchPlan,
        grid: Tuple[int, int],
        tensors: Tuple[torch.Tensor, ...],
        ints: Tuple[int, ...],
        runtime_ints: Tuple[int, ...],
    ) -> None:
        if not DIRECT_LAUNCH:
            self.kernel[grid](*tensors, *ints, *runtime_ints, *plan.constexprs, num_warps=plan.num_warps)
            return
        key = (
            plan.constexprs, plan.num_warps, ints,
            *[t.dtype for t in tensors], *[t.data_ptr() & 15 == 0 for t in tensors],
        )  # fmt: skip
        args = (*tensors, *ints, *runtime_ints, *plan.constexprs)
        launch = self.launchers.get(key, _MISSING)
        if launch is not _MISSING and launch is not None and launch(grid, args):
            return
        compiled = self.kernel[grid](*args, num_warps=plan.num_warps)
        if launch is _MISSING:
            if len(self.launchers) >= MAX_KEYS:
                self.launchers.clear()
            self.launchers[key] = direct_launcher(compiled)
