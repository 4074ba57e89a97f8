"""The forward and backward launchers as torch custom ops for torch.compile (torch >= 2.4).

While torch.compile traces, GemmFunction calls the custom ops: each launch is one opaque node of
known output shapes and strides (the fake implementations), so matmul / bmm / Linear compile with
fullgraph=True. Eager calls go straight to the launchers, which return None for an output they do
not compute where the custom ops return an empty placeholder tensor.
"""

from .._runtime.compat import is_compiling
from .._runtime.registration import custom_op
from .gemm import gemm_backward, gemm_bwd, gemm_bwd_fake, gemm_forward, gemm_fwd, gemm_fwd_fake

gemm_fwd_op = custom_op("fused_gemm::gemm_fwd", gemm_fwd_fake)(gemm_fwd)
gemm_bwd_op = custom_op("fused_gemm::gemm_bwd", gemm_bwd_fake)(gemm_bwd)


def gemm_forward_op(*args):
    """ops.gemm.gemm_forward (c, z or None), through its custom op while torch.compile traces."""
    return gemm_fwd_op(*args) if is_compiling() else gemm_forward(*args)


def gemm_backward_op(*args):
    """ops.gemm.gemm_backward (da, db, dbias, None where not asked for), through its custom op while
    torch.compile traces."""
    return gemm_bwd_op(*args) if is_compiling() else gemm_backward(*args)
