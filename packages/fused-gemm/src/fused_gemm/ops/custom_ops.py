"""The forward and backward launchers as torch custom ops for torch.compile (torch >= 2.4).

While torch.compile traces, GemmFunction calls the custom ops: each launch is one opaque node of
known output shapes and strides (the fake implementations), so matmul / bmm / Linear compile with
fullgraph=True. Eager calls go straight to the launchers (`_runtime.registration.custom_op`).
"""

from .._runtime.registration import custom_op
from .gemm import gemm_bwd, gemm_bwd_fake, gemm_fwd, gemm_fwd_fake

gemm_fwd_op = custom_op("fused_gemm::gemm_fwd", gemm_fwd_fake)(gemm_fwd)
gemm_bwd_op = custom_op("fused_gemm::gemm_bwd", gemm_bwd_fake)(gemm_bwd)
