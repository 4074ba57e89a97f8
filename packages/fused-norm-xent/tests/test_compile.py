"""Every softmax kernel specialization the launcher can choose compiles to a cubin (sm_80, sm_90)."""

import itertools

import pytest
from tritonformer_testkit.aot import ARCHS, compile_to_cubin

from fused_norm_xent.kernels import softmax as kernels
from fused_norm_xent.ops.softmax import launch_config

pytestmark = pytest.mark.aot

TRITON_TYPES = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16"}
# One width per launch shape the heuristic produces: multi-row, one row per block, chunked.
WIDTHS = [1, 100, 1000, 4097, 16384, 65536]


def _cases():
    for width, dtype, log, arch in itertools.product(WIDTHS, TRITON_TYPES, (False, True), ARCHS):
        yield pytest.param(width, dtype, log, arch, id=f"cols{width}-{dtype}-{'log' if log else 'softmax'}-sm{arch}")


@pytest.mark.parametrize("width, dtype, log, arch", list(_cases()))
def test_softmax_kernels_compile(width, dtype, log, arch):
    cfg = launch_config(width)
    ptr = TRITON_TYPES[dtype]
    strides = {"stride_y_row": "i32"}
    if cfg.chunked:
        fwd, bwd = kernels._softmax_fwd_chunked_kernel, kernels._softmax_bwd_chunked_kernel
        consts = {"LOG": log, "BLOCK_N": cfg.block_n}
        sizes = {"n_cols": "i32"}
    else:
        fwd, bwd = kernels._softmax_fwd_kernel, kernels._softmax_bwd_kernel
        consts = {"LOG": log, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n}
        sizes = {"n_rows": "i32", "n_cols": "i32"}
    compile_to_cubin(
        fwd,
        signature={"x_ptr": ptr, "y_ptr": ptr, "stride_x_row": "i32", "stride_x_col": "i32", **strides, **sizes},
        constexprs=consts,
        arch=arch,
        num_warps=cfg.num_warps,
    )
    compile_to_cubin(
        bwd,
        signature={
            "y_ptr": ptr,
            "dy_ptr": ptr,
            "dx_ptr": ptr,
            "stride_dy_row": "i32",
            "stride_dy_col": "i32",
            "stride_dx_row": "i32",
            **strides,
            **sizes,
        },  # fmt: skip
        constexprs=consts,
        arch=arch,
        num_warps=cfg.num_warps,
    )
