"""The forward and backward launchers as torch custom ops for torch.compile (torch >= 2.4).

While torch.compile traces, GemmFunction calls the custom ops: each launch is one opaque node of
known output shapes and strides (the fake implementations), so matmul / bmm / Linear compile with
fullgraph=True. Eager calls go straight to the launchers: the dispatcher round trip of a custom
op costs several microseconds per call, which small matmuls would feel.
"""

import torch

from .._compat import HAS_CUSTOM_OP, is_compiling
from .gemm import gemm_bwd, gemm_bwd_fake, gemm_fwd, gemm_fwd_fake

if HAS_CUSTOM_OP:
    _gemm_fwd_custom = torch.library.custom_op("fused_gemm::gemm_fwd", mutates_args=())(gemm_fwd)
    _gemm_fwd_custom.register_fake(gemm_fwd_fake)
    _gemm_bwd_custom = torch.library.custom_op("fused_gemm::gemm_bwd", mutates_args=())(gemm_bwd)
    _gemm_bwd_custom.register_fake(gemm_bwd_fake)
else:  # pragma: no cover - torch < 2.4
    _gemm_fwd_custom, _gemm_bwd_custom = gemm_fwd, gemm_bwd


def gemm_fwd_op(*args):
    """ops.gemm.gemm_fwd, as a custom op while torch.compile traces."""
    return _gemm_fwd_custom(*args) if is_compiling() else gemm_fwd(*args)


def gemm_bwd_op(*args):
    """ops.gemm.gemm_bwd, as a custom op while torch.compile traces."""
    return _gemm_bwd_custom(*args) if is_compiling() else gemm_bwd(*args)
