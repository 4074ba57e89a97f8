"""What this package adds to the shared version shims (`_runtime.compat`, re-exported here).

Kernels: one code path for every Triton from 2.2 on. Its builtins (tl.dot with acc/out_dtype/
allow_tf32, tl.static_range, tl.debug_barrier, tl.where, autotune restore_value and
early_config_prune, jit do_not_specialize) exist in 2.2 and 3.x alike; on an H100, Triton 3.x
pipelines its pointer loads with cp.async into wgmma (checked in the sm_90 PTX of compiles with
aligned operands: one wgmma group in flight per main-loop step, no spills at the configs kept,
except the pointer forward's 24 bytes at 128x128).

Hopper fast path, chosen here: the forward kernel in a persistent variant whose x and weight
tiles come by TMA through host tensor descriptors (Triton >= 3.4, for the descriptors; sm_90;
16-bit operands whose rows are unit-stride with 16-byte aligned
strides and base, which the launcher checks per call; everything else takes the portable
kernel). Why the forward: its two accumulators put the pointer kernel at ptxas' 255-register
limit with spills at 128x128 (the addresses of three operand tiles); the TMA variant compiles to
186 registers and no spills (cuobjdump, sm_90, Triton 3.9). Its tile loop is not flattened (a
flattened one runs slower on an H100, Triton 3.6), so the next tile's loads wait for the epilogue.
The weight-gradient and down-projection backward kernels have TMA variants too; the backward
kernels compile at 102-228 registers without spills on the pointer path.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._runtime.compat import (  # noqa: F401 - re-exported for the package's modules and tests
    AUTOTUNE_TIMING,
    HAS_TENSOR_DESCRIPTORS,
    INTERPRETING,
    KERNEL_DEVICE_TYPE,
    TRITON_VERSION,
    TensorDescriptor,
    autocast_dtype,
    custom_bwd,
    custom_fwd,
    device_capability,
    multiprocessor_count,
)

# tl.dot(..., input_precision=...) (Triton >= 3.0) states an fp32 dot's precision outright; Triton
# 2.2 has only allow_tf32. (On 3.x, allow_tf32=False yields to a TRITON_F32_DEFAULT setting.)
HAS_INPUT_PRECISION = TRITON_VERSION >= (3, 0)

# The Hopper TMA kernels: host tensor descriptors (Triton >= 3.4), compiled kernels only.
HOPPER_TMA = HAS_TENSOR_DESCRIPTORS and not INTERPRETING


def is_hopper(device_index: Optional[int]) -> bool:
    """sm_90 (H100/H200), where the TMA kernels run; None (or -1): the current CUDA device."""
    device = None if device_index is None or device_index < 0 else torch.device("cuda", device_index)
    return device_capability(device)[0] == 9
