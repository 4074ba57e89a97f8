"""Every kernel specialization the launchers can choose compiles to a cubin (sm_80, sm_90), on a covering set.

Covering, not the cross product (compile time is CI time): every autotune config of each kernel
on each arch it runs on, every value of every constexpr and every dtype appear at least once
(test_the_sets_cover_every_value checks it), each config paired with a dtype and variant it fits
in shared memory (as the autotuner's prune would keep it). Unit strides are specialized to the
constant 1, as Triton's JIT does at launch. The TMA kernel compiles for sm_90 only: the launcher
runs it on Hopper alone (Triton >= 3.4).
"""

import pytest
from tritonformer_testkit.aot import ARCHS, autotune_configs, compile_to_cubin

from fused_gemm._runtime.compat import HAS_TENSOR_DESCRIPTORS, HOPPER_SHARED_MEMORY_PER_BLOCK, TRITON_VERSION
from fused_gemm.kernels.configs import _portable_smem, _tma_smem, portable_configs, splits_epilogue, tma_configs
from fused_gemm.kernels.gemv import _gemv_kernel
from fused_gemm.kernels.grad import _activation_grad_kernel
from fused_gemm.kernels.matmul import _matmul_kernel
from fused_gemm.kernels.matmul_tma import _matmul_tma_kernel

pytestmark = pytest.mark.aot

SIZES = {"fp32": 4, "fp16": 2, "bf16": 2}
RELU, GELU, GELU_TANH = 1, 2, 3


def _flags(bias=False, activation=0, z=False):
    return dict(HAS_BIAS=bias, ACTIVATION=activation, STORE_Z=z)


def _grad_flags(activation, column_sum):
    """The TMA kernel's fused activation gradient (GRAD_Z): reads the saved tile, optional column sums."""
    return dict(_flags(activation=activation), GRAD_Z=True, COLUMN_SUM=column_sum)


# Portable kernel launch variants: flags and the strides that are 1. Forward: A = x (row-major),
# B = weight.t() (unit stride along K) or a row-major w; dX: A = dZ, B = w^T; dW^T: A = dZ^T
# (unit stride along M), B = x, C = dW^T (row-major, or transposed for a row-major w).
PORTABLE_VARIANTS = {
    "fwd": (_flags(), ("stride_ak", "stride_bk", "stride_cn")),
    "fwd-bias-relu": (_flags(bias=True, activation=RELU), ("stride_ak", "stride_bn", "stride_cn")),
    "fwd-bias-gelu-z": (_flags(bias=True, activation=GELU, z=True), ("stride_ak", "stride_bk", "stride_cn")),
    "fwd-gelu-tanh-z": (_flags(activation=GELU_TANH, z=True), ("stride_ak", "stride_bk", "stride_cn")),
    "fwd-bias-gelu": (_flags(bias=True, activation=GELU), ("stride_ak", "stride_bk", "stride_cn")),
    "dx": (_flags(), ("stride_ak", "stride_bn", "stride_cn")),
    "dw": (_flags(), ("stride_am", "stride_bn", "stride_cn")),
    "dw-transposed-out": (_flags(), ("stride_am", "stride_bn", "stride_cm")),
}
# (config index, variant, dtype, EVEN_K, ALLOW_TF32) per arch; every config on both archs.
PORTABLE_CASES = {
    80: [
        (0, "fwd-bias-gelu-z", "bf16", True, False),
        (1, "dx", "fp16", False, False),
        (2, "dw", "bf16", True, False),
        (3, "fwd-gelu-tanh-z", "fp16", False, False),
        (4, "fwd", "fp32", True, True),
        (5, "dw-transposed-out", "fp32", False, False),
        (6, "fwd-bias-gelu", "bf16", True, False),
        (7, "fwd-bias-relu", "fp32", False, True),
        (8, "fwd", "bf16", True, False),
        (9, "fwd-bias-gelu-z", "fp16", False, False),
        (10, "dx", "bf16", True, False),
        (11, "fwd-gelu-tanh-z", "bf16", True, False),
        (12, "fwd", "fp16", False, False),
        (13, "fwd-bias-relu", "bf16", True, False),
        (14, "dx", "fp16", True, False),
    ],
    90: [
        (0, "dw", "bf16", False, False),
        (1, "fwd-bias-relu", "bf16", True, False),
        (2, "fwd-bias-gelu-z", "fp16", False, False),
        (3, "dx", "bf16", True, False),
        (4, "dw-transposed-out", "fp32", False, True),
        (5, "fwd-gelu-tanh-z", "fp32", True, False),
        (6, "fwd", "bf16", False, False),
        (7, "fwd-bias-gelu", "fp32", True, True),
        (8, "fwd-bias-relu", "fp16", False, False),
        (9, "fwd", "bf16", True, False),
        (10, "fwd-bias-gelu", "bf16", False, False),
        (11, "fwd", "bf16", False, False),
        (12, "fwd", "fp32", True, True),
        (13, "fwd-bias-gelu-z", "bf16", True, False),
        (14, "dw", "fp32", False, False),
    ],
}


def _as_dicts(configs):
    """Configs as aot.autotune_configs lists them; the compiled lists, also when collected under the interpreter."""
    return [dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages) for c in configs]


PORTABLE_CONFIGS = _as_dicts(portable_configs(interpreting=False))
TMA_CONFIGS = _as_dicts(tma_configs(interpreting=False))


def _tile(config):
    return f"{config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']}-w{config['num_warps']}s{config['num_stages']}"


def _portable_params():
    configs = PORTABLE_CONFIGS
    for arch in ARCHS:
        for index, variant, dtype, even_k, tf32 in PORTABLE_CASES[arch]:
            config = configs[index]
            yield pytest.param(
                config, variant, dtype, even_k, tf32, arch, id=f"{_tile(config)}-{variant}-{dtype}-sm{arch}"
            )


@pytest.mark.parametrize("config, variant, dtype, even_k, tf32, arch", list(_portable_params()))
def test_portable_kernel_compiles(config, variant, dtype, even_k, tf32, arch):
    flags, unit_strides = PORTABLE_VARIANTS[variant]
    ptr = f"*{dtype}"
    ints = [
        *("stride_a_batch", "stride_am", "stride_ak", "stride_b_batch", "stride_bk", "stride_bn"),
        *("stride_c_batch", "stride_cm", "stride_cn", "M", "N", "K"),
    ]
    signature = {p: ptr for p in ("a_ptr", "b_ptr", "c_ptr", "z_ptr", "bias_ptr")}
    signature.update({name: "i32" for name in ints if name not in unit_strides})
    compile_to_cubin(
        _matmul_kernel,
        signature=signature,
        constexprs={
            **{name: 1 for name in unit_strides},
            "stride_bias": 1,
            **flags,
            "ALLOW_TF32": tf32,
            "UPCAST": False,
            "EVEN_K": even_k,
            **{k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
        },  # fmt: skip
        arch=arch,
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )


# TMA kernel launch variants: flags, A_TRANS, B_TRANS, C_TRANS, BATCHED, SPLIT_OUT (c: the fp32
# split-K workspace, 3-D), FP32_OUT (c in fp32: the workspace, or an fp32 parameter's gradient).
TMA_VARIANTS = {
    "fwd-linear-weight": (_flags(), False, True, False, False, False, False),
    "fwd-linear-weight-bias-gelu-z": (
        _flags(bias=True, activation=GELU, z=True),
        False,
        True,
        False,
        False,
        False,
        False,
    ),
    "fwd-bias-relu": (_flags(bias=True, activation=RELU), False, True, False, False, False, False),
    "dx": (_flags(), False, False, False, False, False, False),
    "dx-fp32-out": (_flags(), False, False, False, False, False, True),
    "dw": (_flags(), True, False, False, False, False, False),
    "dw-transposed-out": (_flags(), True, False, True, False, False, False),
    "dw-fp32-transposed-out": (_flags(), True, False, True, False, False, True),
    "dw-split-k": (_flags(), True, False, False, False, True, True),
    "bmm-fwd": (_flags(), False, False, False, True, False, False),
    "bmm-fwd-bias-gelu-tanh-z": (
        _flags(bias=True, activation=GELU_TANH, z=True),
        False,
        False,
        False,
        True,
        False,
        False,
    ),
    "bmm-db": (_flags(), True, False, True, True, False, False),
    "bmm-split-k": (_flags(), False, False, False, True, True, True),
    "dh-gelu-grad-colsum": (_grad_flags(GELU, True), False, False, False, False, False, False),
    "dh-relu-grad": (_grad_flags(RELU, False), False, False, False, False, False, False),
}
# (config index, variant, dtype), sm_90: the headline configs on the forward and both backward
# products, the two-programs-per-SM (ping-pong) configs on whole-tile and half-tile epilogues, the
# four-stage config's always-split epilogue on a plain (bmm) output, fp32 outputs (split-K partials, an
# fp32 parameter's gradient) on a whole-tile and a ping-pong config.
TMA_CASES = [
    (0, "fwd-linear-weight", "bf16"),
    (0, "fwd-linear-weight-bias-gelu-z", "bf16"),
    (1, "bmm-fwd", "bf16"),
    (2, "dw", "bf16"),
    (3, "dx", "fp16"),
    (4, "bmm-fwd-bias-gelu-tanh-z", "fp16"),
    (5, "fwd-bias-relu", "bf16"),
    (8, "dw-transposed-out", "fp16"),
    (9, "bmm-db", "bf16"),
    (0, "dw-split-k", "bf16"),
    (4, "dw-split-k", "fp16"),
    (8, "bmm-split-k", "bf16"),
    (0, "dw-fp32-transposed-out", "bf16"),
    (4, "dx-fp32-out", "bf16"),
    (6, "fwd-linear-weight-bias-gelu-z", "bf16"),
    (7, "bmm-fwd-bias-gelu-tanh-z", "bf16"),
    (0, "dh-gelu-grad-colsum", "bf16"),
    (6, "dh-gelu-grad-colsum", "bf16"),
    (4, "dh-relu-grad", "fp16"),
]


def _tma_params():
    configs = TMA_CONFIGS
    for index, variant, dtype in TMA_CASES:
        config = configs[index]
        yield pytest.param(config, variant, dtype, id=f"{_tile(config)}-{variant}-{dtype}-sm90")


@pytest.mark.skipif(
    not HAS_TENSOR_DESCRIPTORS,
    reason="this Triton has no tensor descriptors (< 3.4): launchers use the portable kernel only",
)
@pytest.mark.parametrize("config, variant, dtype", list(_tma_params()))
def test_tma_kernel_compiles(config, variant, dtype):
    flags, a_trans, b_trans, c_trans, batched, split_out, fp32_out = TMA_VARIANTS[variant]
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]

    def desc(block, dtype=dtype, three_d=batched):
        return f"tensordesc<{dtype}[{','.join(str(d) for d in [1] * three_d + block)}]>"

    flags = {"GRAD_Z": False, "COLUMN_SUM": False, **flags}
    uses_z = flags["STORE_Z"] or flags["GRAD_Z"]
    halves = splits_epilogue(config, flags["ACTIVATION"], uses_z, fp32_out)
    c_cols = bn // 2 if halves else bn
    c_block = [c_cols, bm] if c_trans else [bm, c_cols]
    signature = {
        "a_desc": desc([bk, bm] if a_trans else [bm, bk]),
        "b_desc": desc([bn, bk] if b_trans else [bk, bn]),
        "c_desc": desc(c_block, "fp32" if fp32_out else dtype, batched or split_out),
        "bias_ptr": f"*{dtype}",
        "colsum_ptr": "*fp32",
        "M": "i32", "N": "i32", "K": "i32", "BATCH": "i32", "SPLIT_K": "i32",
    }  # fmt: skip
    optional = {}
    if uses_z:
        signature["z_desc"] = desc(c_block)
    else:
        optional["z_desc"] = None  # the launcher passes None: a constexpr
    compile_to_cubin(
        _matmul_tma_kernel,
        signature=signature,
        constexprs={
            **optional,
            "stride_bias": 1,
            **flags,
            "A_TRANS": a_trans,
            "B_TRANS": b_trans,
            "C_TRANS": c_trans,
            "BATCHED": batched,
            "SPLIT_OUT": split_out,
            "UPCAST": False,
            "NUM_SMS": 132,
            **{k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "PROGRAMS_PER_SM", "EPILOGUE_SPLIT")},
        },  # fmt: skip
        arch=90,
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )


# The GEMV kernel: (dtype, output dtype, flags, BLOCK_N, BLOCK_K, EVEN_K, a's K stride 1) as
# ops.launch._gemv_plan picks them: both row counts, K in whole blocks or not, every epilogue.
GEMV_CASES = [
    ("bf16", "bf16", _flags(True, GELU, True), 4, 512, True, True),
    ("fp16", "fp16", _flags(False, RELU), 8, 512, False, True),
    ("bf16", "fp32", _flags(True), 8, 64, False, False),
    ("fp16", "fp16", _flags(False, GELU_TANH), 4, 128, True, True),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: "-".join(str(v) for v in c[:2] + c[3:6]))
def test_gemv_kernel_compiles(case, arch):
    dtype, out_dtype, flags, block_n, block_k, even_k, unit_a = case
    ints = ["stride_a_batch", "stride_w_batch", "stride_wn", "stride_c_batch", "N", "K"]
    ints += [] if unit_a else ["stride_ak"]
    pointers = {"a_ptr": dtype, "w_ptr": dtype, "c_ptr": out_dtype, "z_ptr": out_dtype, "bias_ptr": dtype}
    signature = {**{name: f"*{t}" for name, t in pointers.items()}, **{name: "i32" for name in ints}}
    constexprs = dict(flags, stride_cn=1, stride_bias=1, UPCAST=False, BLOCK_N=block_n, BLOCK_K=block_k,
                      EVEN_K=even_k, **({"stride_ak": 1} if unit_a else {}))  # fmt: skip
    compile_to_cubin(_gemv_kernel, signature=signature, constexprs=constexprs, arch=arch, num_warps=4, num_stages=1)


# The elementwise backward pass: (ACTIVATION, WRITE_DZ, COLUMN_SUM, dtype, the dy stride that is 1).
GRAD_CASES = [
    (GELU, True, True, "bf16", "stride_dy_n"),
    (GELU_TANH, True, False, "fp16", "stride_dy_n"),
    (RELU, True, True, "fp32", "stride_dy_m"),
    (0, False, True, "bf16", "stride_dy_n"),
]
GRAD_TILE = {"BLOCK_M": 32, "BLOCK_N": 256}  # configs.GRAD_TILE when compiled


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("activation, write_dz, column_sum, dtype, unit_stride", GRAD_CASES)
def test_activation_grad_kernel_compiles(activation, write_dz, column_sum, dtype, unit_stride, arch):
    ints = ("stride_dy_batch", "stride_dy_m", "stride_dy_n", "M", "N", "ROWS")
    partial = "*fp64" if dtype == "fp32" else "*fp32"  # fp32 gradients sum their columns in fp64
    signature = {"dy_ptr": f"*{dtype}", "saved_ptr": f"*{dtype}", "dz_ptr": f"*{dtype}", "partial_ptr": partial}
    signature.update({name: "i32" for name in ints if name != unit_stride})
    compile_to_cubin(
        _activation_grad_kernel,
        signature=signature,
        constexprs={
            unit_stride: 1,
            "ACTIVATION": activation,
            "WRITE_DZ": write_dz,
            "COLUMN_SUM": column_sum,
            "UPCAST": False,
            **GRAD_TILE,
        },  # fmt: skip
        arch=arch,
        num_warps=8,
        num_stages=3,
    )


def test_the_sets_cover_every_value():
    """Each config on each arch, each constexpr value and dtype at least once, every case fitting shared memory."""
    assert autotune_configs(_matmul_kernel) == PORTABLE_CONFIGS
    assert autotune_configs(_matmul_tma_kernel) == TMA_CONFIGS
    configs = PORTABLE_CONFIGS
    for arch, cases in PORTABLE_CASES.items():
        assert sorted(case[0] for case in cases) == list(range(len(configs))), arch
    portable = [case for cases in PORTABLE_CASES.values() for case in cases]
    assert {case[1] for case in portable} == set(PORTABLE_VARIANTS)
    flags = [PORTABLE_VARIANTS[case[1]][0] for case in portable]
    for name, values in _flags_values().items():
        assert {f[name] for f in flags} == values, name
    assert {case[2] for case in portable} == set(SIZES)
    assert {case[3] for case in portable} == {True, False} and {case[4] for case in portable} == {True, False}
    assert all(case[2] == "fp32" for case in portable if case[4]), "ALLOW_TF32 only matters for fp32"
    for index, _, dtype, _, _ in portable:
        smem = _portable_smem(configs[index], configs[index]["num_stages"], SIZES[dtype])
        assert smem <= HOPPER_SHARED_MEMORY_PER_BLOCK, (index, dtype)

    configs = TMA_CONFIGS
    assert sorted({case[0] for case in TMA_CASES}) == list(range(len(configs)))
    assert {case[1] for case in TMA_CASES} == set(TMA_VARIANTS)
    variants = [TMA_VARIANTS[case[1]] for case in TMA_CASES]
    for name, values in _flags_values().items():
        assert {v[0][name] for v in variants} == values, name
    for i, name in enumerate(("A_TRANS", "B_TRANS", "C_TRANS", "BATCHED", "SPLIT_OUT", "FP32_OUT"), start=1):
        assert {v[i] for v in variants} == {True, False}, name
    assert {case[2] for case in TMA_CASES} == {"bf16", "fp16"}
    assert {configs[case[0]]["PROGRAMS_PER_SM"] for case in TMA_CASES} == {1, 2}
    plain = [
        case
        for case in TMA_CASES
        if not (TMA_VARIANTS[case[1]][0]["ACTIVATION"] or TMA_VARIANTS[case[1]][0]["STORE_Z"])
    ]
    assert {configs[case[0]]["EPILOGUE_SPLIT"] for case in plain} == {True, False}, "split and whole plain epilogues"
    for index, variant, _ in TMA_CASES:
        config, flags, fp32_out = configs[index], TMA_VARIANTS[variant][0], TMA_VARIANTS[variant][6]
        grad_z = flags.get("GRAD_Z", False)
        halves = splits_epilogue(config, flags["ACTIVATION"], flags["STORE_Z"] or grad_z, fp32_out)
        smem = _tma_smem(config, config["num_stages"], 2, halves, 4 if fp32_out else 2)
        programs = config["PROGRAMS_PER_SM"]
        assert programs * (smem + 1024) <= HOPPER_SHARED_MEMORY_PER_BLOCK + 1024, (index, variant)

    gemv_flags = [case[2] for case in GEMV_CASES]
    assert {f["ACTIVATION"] for f in gemv_flags} == {0, RELU, GELU, GELU_TANH}
    for name in ("HAS_BIAS", "STORE_Z"):
        assert {f[name] for f in gemv_flags} == {True, False}, name
    assert {case[3] for case in GEMV_CASES} == {4, 8} and {case[5] for case in GEMV_CASES} == {True, False}
    assert {case[0] for case in GEMV_CASES} == {"bf16", "fp16"}

    assert {case[0] for case in GRAD_CASES} == {0, RELU, GELU, GELU_TANH}
    assert {case[1] for case in GRAD_CASES} == {case[2] for case in GRAD_CASES} == {True, False}
    assert {case[3] for case in GRAD_CASES} == set(SIZES)


def test_grad_tile_is_the_launchers():
    """GRAD_TILE above is the compiled launch's tile (configs.GRAD_TILE outside the interpreter)."""
    from fused_gemm._runtime.compat import INTERPRETING
    from fused_gemm.kernels import configs

    if not INTERPRETING:
        assert {k: configs.GRAD_TILE[k] for k in GRAD_TILE} == GRAD_TILE and configs.GRAD_TILE["num_warps"] == 8


def _flags_values():
    return {"HAS_BIAS": {True, False}, "ACTIVATION": {0, RELU, GELU, GELU_TANH}, "STORE_Z": {True, False}}


def _warp_specialized_module():
    """kernels/matmul_ws.py, or a skip off Triton 3.6: the kernel is written against 3.6's Gluon API
    (later versions renamed its TMA copies) and the launcher takes it on 3.6 only."""
    if TRITON_VERSION != (3, 6):
        pytest.skip(f"kernels.matmul_ws is written against Triton 3.6's Gluon API (installed: {TRITON_VERSION})")
    from fused_gemm.kernels import matmul_ws

    return matmul_ws


@pytest.mark.parametrize("activation, bias, dtype", [(GELU, True, "bf16"), (RELU, False, "fp16"),
                                                     (GELU_TANH, True, "fp16")])  # fmt: skip
def test_warp_specialized_kernel_compiles(activation, bias, dtype):
    """The Gluon kernel for sm_90 as ops.launch's _ws_plan launches it (num_warps a compile option,
    read inside the kernel), its wgmmas not serialized."""
    ws = _warp_specialized_module()
    from tritonformer_testkit.aot import gluon_descriptor_type

    signature = {
        "a_desc": gluon_descriptor_type([ws.BLOCK_M, ws.BLOCK_K], dtype),
        "w_desc": gluon_descriptor_type([ws.BLOCK_N, ws.BLOCK_K], dtype),
        "c_desc": gluon_descriptor_type([ws.BLOCK_M, ws.CHUNK_N], dtype),
        "bias_ptr": f"*{dtype}", "M": "i32", "N": "i32", "K": "i32",
    }  # fmt: skip
    constexprs = dict(NSTAGES=ws.STAGES, GROUP=ws.GROUP_M, ACTIVATION=activation, HAS_BIAS=bias,
                      EPI_WARPS=ws.EPILOGUE_WARPS, EPI_REGISTERS=ws.EPILOGUE_REGISTERS)  # fmt: skip
    compile_to_cubin(ws._matmul_ws_kernel, signature=signature, constexprs=constexprs, arch=90,
                     num_warps=ws.MMA_WARPS)  # fmt: skip
