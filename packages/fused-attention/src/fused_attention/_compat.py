"""What this package adds to the shared version shims and device facts (`_runtime.compat`).

Host-side TMA tensor descriptors (Triton >= 3.4): on Hopper (sm_90+) the fully visible K/V tiles
(Q/dO in the dK/dV kernel) are copied by the tensor memory accelerator into shared memory,
multi-buffered with mbarriers, instead of per-thread pointer loads. Not used here: automatic warp
specialization (`tl.range(..., warp_specialize=True)`): Triton 3.6 and 3.9 leave the attention
loop unpartitioned on sm_90 at 8 warps and fail to compile it at 4 (checked ahead of time), so
it cannot pay; and persistent scheduling, which without warp specialization only replaces the
hardware block scheduler (the grids walk the longest causal rows first instead). Explicit
asynchronous MMAs are used where Triton's own pipeline leaves time: the Gluon dK/dV kernel
(kernels/attention_bwd_hopper.py), where the shared runtime's HAS_GLUON_HOPPER holds.
"""

from __future__ import annotations

from ._runtime.compat import INTERPRETING

# The interpreter computes bf16 arithmetic and bf16/fp16 tl.dot on raw bits: kernels upcast their
# dot operands to fp32 when interpreting (a constexpr, so compiled kernels never see the branch).
UPCAST_DOTS = INTERPRETING
