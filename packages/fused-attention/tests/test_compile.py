"""Every attention kernel specialization the launchers can choose compiles to a cubin (sm_80, sm_90).

A covering set, not the cross product: each kernel meets every autotune config of every head-dim
class (pointer loads, and on Triton >= 3.4 for sm_90 the TMA variants, with descriptors in both
dim orders), both dtypes, both architectures, each mask/bias/softcap/dropout/varlen
specialization, both program orders (BLOCK_MAJOR), and all nine head dims appear across the set;
the dK/dV kernel compiles with and without its atomic dQ accumulation (DQ_ATOMIC) in each head-dim
class and load path. On sm_90 (Triton 3.x) ptxas must not have serialized the kernel's wgmma
instructions (its note C7515 and kin): a 10 % slowdown that no result shows.
"""

import itertools

import pytest
import triton
from tritonformer_testkit.aot import compile_to_cubin

from fused_attention._runtime.compat import HAS_TENSOR_DESCRIPTORS
from fused_attention.kernels.attention_bwd import _attn_bwd_dq_convert_kernel, _attn_bwd_preprocess_kernel
from fused_attention.ops.configs import (
    DQ_ATOMIC,
    KERNELS,
    POINTER_CONFIGS,
    PREPROCESS_BLOCK_M,
    PREPROCESS_WARPS,
    TMA_CONFIGS,
)

pytestmark = pytest.mark.aot

HEAD_DIMS = {64: (16, 32, 64), 128: (80, 96, 128), 256: (160, 192, 256)}
DTYPES = ("fp16", "bf16")
# (IS_VARLEN, HAS_LEFT, HAS_RIGHT, ALIBI, SOFTCAP, DROPOUT): causal; full; varlen causal ALiBi;
# window + ALiBi; causal softcap with dropout (Gemma-2 training); full softcap with ALiBi; varlen
# window with dropout.
FLAGS = [
    (False, False, True, False, False, False),
    (False, False, False, False, False, False),
    (True, False, True, True, False, False),
    (False, True, True, True, False, False),
    (False, False, True, False, True, True),
    (False, False, False, True, True, False),
    (True, True, True, False, False, True),
]
# Which block dim a kernel's TMA descriptors span.
DESCRIPTOR_ROWS = {"fwd": "block_n", "dkdv": "block_m", "dq": "block_n"}


def _type(name: str, dtype: str, descriptor: str) -> str:
    if name.endswith("_desc"):
        return descriptor
    if name in ("lse_ptr", "delta_ptr", "slopes_ptr", "dlse_ptr", "dq_accum_ptr"):
        return "*fp32"
    if name.startswith("cu_seqlens") or name == "rng_ptr":
        return "*i32"
    if name.endswith("_ptr"):
        return f"*{dtype}"
    return "fp32" if name in ("softmax_scale", "softcap_in", "softcap_out", "dropout_scale") else "i32"


def _dq_modes(kind, block_d):
    """The dK/dV kernel's DQ_ATOMIC values to compile: both for every config of a class that uses
    atomics for long sequences (short ones and the deterministic backward run without)."""
    if kind != "dkdv" or not DQ_ATOMIC[block_d]:
        return (False,)
    return (True, False)


def _cases():
    counter = itertools.count()
    for kind_index, kind in enumerate(KERNELS):
        for tma, table in ((False, POINTER_CONFIGS), (True, TMA_CONFIGS)):
            for block_d, configs in table[kind].items():
                for config in configs:
                    for dq_atomic in _dq_modes(kind, block_d):
                        n = next(counter)
                        head_dim = HEAD_DIMS[block_d][(n + kind_index) % 3]
                        arch = 90 if tma else (80, 90)[n % 2]
                        dtype = DTYPES[n % 2 if tma else (n // 2) % 2]
                        flags = FLAGS[n % len(FLAGS)]
                        block_major = (n // 3) % 2 == 1
                        shape = f"{config.block_m}x{config.block_n}w{config.num_warps}s{config.num_stages}"
                        yield pytest.param(
                            kind, config, head_dim, dtype, flags, tma, arch, dq_atomic, block_major,
                            id=f"{kind}-d{head_dim}-{shape}-{'tma-' if tma else ''}{dtype}-flags{n % len(FLAGS)}"
                            f"-sm{arch}{'-atomic' if dq_atomic else ''}{'-blockmajor' if block_major else ''}",
                        )  # fmt: skip


@pytest.mark.parametrize("kind, config, head_dim, dtype, flags, tma, arch, dq_atomic, block_major", list(_cases()))
def test_attention_kernels_compile(kind, config, head_dim, dtype, flags, tma, arch, dq_atomic, block_major):
    if tma and not HAS_TENSOR_DESCRIPTORS:
        pytest.skip("TMA descriptors need Triton >= 3.4: the launchers never choose these configs here")
    block_d = triton.next_power_of_2(head_dim)
    rows = getattr(config, DESCRIPTOR_ROWS[kind])
    is_varlen, has_left, has_right, alibi, softcap, dropout = flags
    # TMA views put the heads outside the positions for the SDPA layout (never for a packed batch).
    heads_outer = tma and not is_varlen and head_dim % 32 == 0
    block = [1, 1, rows, block_d] if heads_outer else [1, rows, 1, block_d]
    descriptor = f"tensordesc<{dtype}[{','.join(map(str, block))}]>" if tma else f"*{dtype}"
    constexprs = dict(
        HEAD_DIM=head_dim, BLOCK_D=block_d, IS_VARLEN=is_varlen, HAS_LEFT=has_left, HAS_RIGHT=has_right,
        ALIBI=alibi, SOFTCAP=softcap, DROPOUT=dropout, UPCAST=False, HEADS_OUTER=heads_outer,
        BLOCK_MAJOR=block_major, **config.meta(),
    )  # fmt: skip
    kernel = KERNELS[kind]
    if kind == "dkdv":
        constexprs["DQ_ATOMIC"] = dq_atomic
    signature = {name: _type(name, dtype, descriptor) for name in kernel.arg_names if name not in constexprs}
    # On sm_90 the testkit also fails the compile when ptxas serialized the wgmmas (the ALiBi
    # loops' order once did).
    compile_to_cubin(
        kernel, signature=signature, constexprs=constexprs, arch=arch, num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip


@pytest.mark.parametrize(
    "block_d, dtype, is_varlen, has_dlse, zero_dq, arch",
    [(64, "fp16", False, True, True, 80), (128, "bf16", True, False, True, 90), (256, "bf16", False, False, False, 80)],
)
def test_preprocess_kernel_compiles(block_d, dtype, is_varlen, has_dlse, zero_dq, arch):
    head_dim = HEAD_DIMS[block_d][1]
    kernel = _attn_bwd_preprocess_kernel
    constexprs = dict(
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=PREPROCESS_BLOCK_M[block_d], IS_VARLEN=is_varlen,
        HAS_DLSE=has_dlse, ZERO_DQ=zero_dq,
    )  # fmt: skip
    signature = {name: _type(name, dtype, "") for name in kernel.arg_names if name not in constexprs}
    compile_to_cubin(kernel, signature=signature, constexprs=constexprs, arch=arch, num_warps=PREPROCESS_WARPS)


@pytest.mark.parametrize("block_d, dtype, is_varlen, arch", [(64, "bf16", True, 90), (64, "fp16", False, 80)])
def test_dq_convert_kernel_compiles(block_d, dtype, is_varlen, arch):
    """The atomic dQ path's conversion (the BLOCK_D class 64 uses it, configs.DQ_ATOMIC)."""
    head_dim = HEAD_DIMS[block_d][2]
    kernel = _attn_bwd_dq_convert_kernel
    constexprs = dict(
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=PREPROCESS_BLOCK_M[block_d], IS_VARLEN=is_varlen, UPCAST=False
    )
    signature = {name: _type(name, dtype, "") for name in kernel.arg_names if name not in constexprs}
    compile_to_cubin(kernel, signature=signature, constexprs=constexprs, arch=arch, num_warps=PREPROCESS_WARPS)


def _hopper_module():
    """kernels/attention_bwd_hopper.py, or a skip where the installed Triton has no Gluon Hopper API."""
    try:
        from fused_attention.kernels import attention_bwd_hopper
    except ImportError:
        pytest.skip(
            f"Triton {triton.__version__} has no Gluon Hopper API (the Hopper dK/dV kernel needs Triton >= 3.6)"
        )
    return attention_bwd_hopper


@pytest.mark.parametrize(
    "head_dim, causal, heads_outer, block_major, dtype",
    [(128, True, False, True, "bf16"), (64, True, True, True, "fp16"), (128, False, True, False, "fp16"),
     (64, False, False, False, "bf16")],
    ids=["d128-causal-bshd", "d64-causal-bhsd-fp16", "d128-full-bhsd-fp16", "d64-full-bshd"],
)  # fmt: skip
def test_hopper_dkdv_kernel_compiles(head_dim, causal, heads_outer, block_major, dtype):
    """The Gluon dK/dV kernel for sm_90 in each specialization the launcher chooses (mask, layout,
    program order, each head dim's ring stages), its wgmmas not serialized. It runs on Triton 3.6
    only (ops/launch.py); newer Tritons of the matrix compile it here, their TMA load renamed."""
    hopper = _hopper_module()
    from tritonformer_testkit.aot import gluon_descriptor_type

    kernel = hopper._attn_bwd_dkdv_hopper_kernel

    def descriptor(rows):
        return gluon_descriptor_type([1, 1, rows, head_dim] if heads_outer else [1, rows, 1, head_dim], dtype)

    constexprs = dict(CAUSAL=causal, HEADS_OUTER=heads_outer, BLOCK_MAJOR=block_major, STAGES=hopper.STAGES[head_dim])
    signature = {
        "q_desc": descriptor(hopper.BLOCK_M), "k_desc": descriptor(hopper.BLOCK_N),
        "v_desc": descriptor(hopper.BLOCK_N), "do_desc": descriptor(hopper.BLOCK_M), "lse_ptr": "*fp32",
        "delta_ptr": "*fp32", "dk_ptr": f"*{dtype}", "dv_ptr": f"*{dtype}", "qk_scale": "fp32",
        "softmax_scale": "fp32",
    }  # fmt: skip
    for name in kernel.arg_names:
        if name not in signature and name not in constexprs:
            signature[name] = "i32"
    compile_to_cubin(kernel, signature=signature, constexprs=constexprs, arch=90, num_warps=hopper.NUM_WARPS)
