"""The forward and backward launchers as torch custom ops (torch >= 2.4), plain functions before.

As custom ops with fake implementations, torch.compile treats each launch as one opaque node of
known output shapes and strides, so matmul / bmm / Linear compile with fullgraph=True.
"""

from .._compat import HAS_CUSTOM_OP
from .gemm import gemm_bwd, gemm_bwd_fake, gemm_fwd, gemm_fwd_fake

if HAS_CUSTOM_OP:
    import torch

    gemm_fwd_op = torch.library.custom_op("fused_gemm::gemm_fwd", mutates_args=())(gemm_fwd)
    gemm_fwd_op.register_fake(gemm_fwd_fake)
    gemm_bwd_op = torch.library.custom_op("fused_gemm::gemm_bwd", mutates_args=())(gemm_bwd)
    gemm_bwd_op.register_fake(gemm_bwd_fake)
else:  # pragma: no cover - torch < 2.4
    gemm_fwd_op = gemm_fwd
    gemm_bwd_op = gemm_bwd
