"""Every kernel specialization the launchers can choose compiles to a cubin (sm_80, sm_90).

A covering set, not the cross product: every autotune config of every kernel, every dtype and
every constexpr value appears at least once, each case on both architectures. The kernels that
evaluate the gate's activation compile with SiLU in every case and with GELU-tanh (GeGLU) in a
few (GELU_CASES). Strides that
the JIT sees as 1 (contiguous operands, the usual case) are compiled as the constant 1, as the
JIT specializes them; one case per kernel keeps every stride a runtime value (transposed or
strided operands).
"""

import pytest
from tritonformer_testkit import interpreting
from tritonformer_testkit.aot import ARCHS, autotune_configs, compile_to_cubin

from fused_swiglu._compat import TRITON_VERSION
from fused_swiglu.kernels.activation import ACTIVATION_CODES
from fused_swiglu.kernels.backward import (
    _mlp_down_grad_kernel,
    _mlp_down_grad_tma_kernel,
    _swiglu_grad_kernel,
    _swiglu_input_grad_kernel,
    _swiglu_input_grad_tma_kernel,
    _swiglu_weight_grad_kernel,
    _swiglu_weight_grad_tma_kernel,
    _weight_grad_reduce_kernel,
)
from fused_swiglu.kernels.forward import _swiglu_fwd_kernel, _swiglu_fwd_tma_kernel
from fused_swiglu.ops.launchers import GRAD_BLOCK_M, GRAD_BLOCK_N, GRAD_NUM_WARPS, REDUCE_NUM_WARPS, REDUCE_ROWS

pytestmark = pytest.mark.aot

POINTER = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16"}
# The ACTIVATION constexpr's values.
SILU, GELU_TANH = ACTIVATION_CODES["silu"], ACTIVATION_CODES["gelu_tanh"]


def _known_serialized(constexprs) -> bool:
    """The fp16-accumulate kernels: ptxas serializes their wgmmas on sm_90 (a known defect, README
    "Performance"); the testkit fails any other sm_90 compile it finds serialized."""
    return bool(constexprs.get("ACC_FP16"))


# SMs of the target, a constexpr of the weight gradient (its last-wave split) and the TMA forward.
NUM_SMS = {80: 108, 90: 132}

# kernel -> (pointer args, int args, the int args that are 1 for contiguous operands)
KERNELS = {
    "fwd": (
        _swiglu_fwd_kernel,
        ["x_ptr", "wg_ptr", "wu_ptr", "bg_ptr", "bu_ptr", "h_ptr", "g_ptr", "u_ptr"],
        ["stride_xm", "stride_xk", "stride_wgk", "stride_wgn", "stride_wuk", "stride_wun", "stride_hm", "M", "N", "K"],
        ["stride_xk", "stride_wgn", "stride_wun"],
    ),
    "input_grad": (
        _swiglu_input_grad_kernel,
        ["dg_ptr", "du_ptr", "wg_ptr", "wu_ptr", "dx_ptr"],
        ["stride_dm", "stride_wgk", "stride_wgn", "stride_wuk", "stride_wun", "stride_dxm", "M", "K", "N"],
        ["stride_wgn", "stride_wun"],
    ),
    "weight_grad": (
        _swiglu_weight_grad_kernel,
        ["x_ptr", "dg_ptr", "du_ptr", "dwg_ptr", "dwu_ptr", "ws_ptr"],
        ["stride_xm", "stride_xk", "stride_dm", "stride_dwk", "stride_dwn", "M", "N", "K", "split"],
        ["stride_xk", "stride_dwn", "split"],
    ),
    "down_grad": (
        _mlp_down_grad_kernel,
        ["dy_ptr", "wd_ptr", "g_ptr", "u_ptr", "h_ptr"],
        ["stride_dym", "stride_dyd", "stride_wdn", "stride_wdd", "stride_gm", "M", "N", "D"],
        ["stride_dyd", "stride_wdd"],
    ),
}

# Per config index of each autotuned kernel: (dtype, contiguous strides, constexprs besides the config).
# The "EVEN" heuristic (reduction divisible by the block) alternates; fp16 accumulation and TF32
# appear where the launchers can pick them (fp16 / fp32 operands). "Contiguous" also compiles the
# weight gradient's split count as the value 1 (no split: what the JIT specializes on); the
# strided cases keep it a runtime value (the split path).
CASES = {
    "fwd": [
        ("bf16", True, dict(HAS_BIAS=False, SAVE_GU=True, ACC_FP16=False, ALLOW_TF32=False, EVEN_K=True)),
        ("fp16", True, dict(HAS_BIAS=True, SAVE_GU=False, ACC_FP16=True, ALLOW_TF32=False, EVEN_K=False)),
        ("fp32", True, dict(HAS_BIAS=False, SAVE_GU=True, ACC_FP16=False, ALLOW_TF32=True, EVEN_K=True)),
        ("bf16", False, dict(HAS_BIAS=True, SAVE_GU=True, ACC_FP16=False, ALLOW_TF32=False, EVEN_K=False)),
        # The skinny tiles (decode steps: nothing saved).
        ("bf16", True, dict(HAS_BIAS=False, SAVE_GU=False, ACC_FP16=False, ALLOW_TF32=False, EVEN_K=True)),
        ("fp16", True, dict(HAS_BIAS=True, SAVE_GU=False, ACC_FP16=False, ALLOW_TF32=False, EVEN_K=False)),
        ("bf16", False, dict(HAS_BIAS=False, SAVE_GU=True, ACC_FP16=False, ALLOW_TF32=False, EVEN_K=False)),
        ("fp16", True, dict(HAS_BIAS=False, SAVE_GU=False, ACC_FP16=True, ALLOW_TF32=False, EVEN_K=True)),
        ("fp16", True, dict(HAS_BIAS=False, SAVE_GU=True, ACC_FP16=True, ALLOW_TF32=False, EVEN_K=True)),
    ],
    "input_grad": [
        ("bf16", True, dict(ACC_FP16=False, ALLOW_TF32=False, EVEN_N=True)),
        ("fp16", True, dict(ACC_FP16=True, ALLOW_TF32=False, EVEN_N=False)),
        ("fp32", False, dict(ACC_FP16=False, ALLOW_TF32=True, EVEN_N=True)),
        ("fp16", True, dict(ACC_FP16=False, ALLOW_TF32=False, EVEN_N=False)),
        ("fp32", True, dict(ACC_FP16=False, ALLOW_TF32=False, EVEN_N=False)),
    ],
    "weight_grad": [
        ("bf16", True, dict(ALLOW_TF32=False, EVEN_M=True)),
        ("fp16", False, dict(ALLOW_TF32=False, EVEN_M=False)),
        ("fp32", True, dict(ALLOW_TF32=True, EVEN_M=True)),
        ("bf16", True, dict(ALLOW_TF32=False, EVEN_M=False)),
        ("fp32", True, dict(ALLOW_TF32=False, EVEN_M=False)),
    ],
    "down_grad": [
        ("bf16", True, dict(ALLOW_TF32=False, EVEN_D=True)),
        ("fp16", True, dict(ALLOW_TF32=False, EVEN_D=False)),
        ("bf16", False, dict(ALLOW_TF32=False, EVEN_D=True)),
        ("fp32", True, dict(ALLOW_TF32=True, EVEN_D=False)),
        ("fp32", True, dict(ALLOW_TF32=False, EVEN_D=True)),
    ],
}


# The kernels that take the ACTIVATION constexpr: SiLU in every case of CASES and TMA_KERNELS,
# GELU-tanh in these, by config index. Its epilogue math is the same in every tile; the cases are
# the tiles where its registers matter most: the forward's training workhorse (cfg0, 128 x 128,
# two accumulators) and a decode tile, the down-projection backward's two epilogue schedules (row
# slices, and g, u prefetched), and the TMA variants' workhorses.
ACTIVATION_KERNELS = {"fwd", "down_grad", "fwd_tma", "down_grad_tma"}
GELU_CASES = {
    "fwd": {
        0: ("bf16", True, dict(HAS_BIAS=False, SAVE_GU=True, ACC_FP16=False, ALLOW_TF32=False, EVEN_K=True)),
        4: ("fp16", True, dict(HAS_BIAS=True, SAVE_GU=False, ACC_FP16=False, ALLOW_TF32=False, EVEN_K=False)),
    },
    "down_grad": {
        0: ("bf16", True, dict(ALLOW_TF32=False, EVEN_D=True)),
        1: ("fp16", False, dict(ALLOW_TF32=False, EVEN_D=False)),
    },
}

# The weight gradient of fp32 weights under autocast: 16-bit operands, dw_gate and dw_up in fp32
# (the accumulator stored uncast); every config once.
WEIGHT_GRAD_FP32_OUT_CASES = [
    ("bf16", True, dict(ALLOW_TF32=False, EVEN_M=True)),
    ("fp16", False, dict(ALLOW_TF32=False, EVEN_M=False)),
    ("bf16", True, dict(ALLOW_TF32=False, EVEN_M=False)),
    ("fp16", True, dict(ALLOW_TF32=False, EVEN_M=True)),
    ("bf16", False, dict(ALLOW_TF32=False, EVEN_M=True)),
]


def _with_activation(name, constexprs, activation):
    """The case's constexprs, with ACTIVATION where the kernel takes it."""
    return dict(constexprs, ACTIVATION=activation) if name in ACTIVATION_KERNELS else constexprs


def _params():
    groups = [(name, dict(enumerate(cases)), None, SILU) for name, cases in CASES.items()]
    groups.append(("weight_grad", dict(enumerate(WEIGHT_GRAD_FP32_OUT_CASES)), "fp32", SILU))
    groups += [(name, cases, None, GELU_TANH) for name, cases in GELU_CASES.items()]
    for name, cases, out_dtype, activation in groups:
        configs = autotune_configs(KERNELS[name][0])
        # Under the interpreter the kernels carry its one config, and these tests are skipped.
        if activation == SILU:  # every config (the GELU cases are a few of them)
            message = f"{name}: {len(configs)} configs but {len(cases)} cases"
            assert interpreting() or len(configs) == len(cases), message
        for index, (dtype, contiguous, constexprs) in cases.items():
            if index >= len(configs):
                assert interpreting(), f"{name}: no config {index}"
                continue  # the interpreter's one config
            for arch in ARCHS:
                layout = "contiguous" if contiguous else "strided"
                out = f"-to-{out_dtype}" if out_dtype else ""
                gelu = "-gelu_tanh" if activation == GELU_TANH else ""
                yield pytest.param(
                    name, configs[index], dtype, out_dtype or dtype, contiguous,
                    _with_activation(name, constexprs, activation), arch,
                    id=f"{name}-cfg{index}-{dtype}{out}-{layout}{gelu}-sm{arch}",
                )  # fmt: skip


@pytest.mark.parametrize("name, config, dtype, out_dtype, contiguous, constexprs, arch", list(_params()))
def test_autotuned_kernels_compile(name, config, dtype, out_dtype, contiguous, constexprs, arch):
    kernel, pointers, ints, unit_strides = KERNELS[name]
    config = dict(config)
    num_warps, num_stages = config.pop("num_warps"), config.pop("num_stages")
    fixed = {s: 1 for s in unit_strides} if contiguous else {}
    signature = {p: POINTER[dtype] for p in pointers}
    signature.update({i: "i32" for i in ints if i not in fixed})
    constexprs = dict(constexprs, UPCAST=False, **config, **fixed)
    if name == "weight_grad":
        signature.update(ws_ptr="*fp32", dwg_ptr=POINTER[out_dtype], dwu_ptr=POINTER[out_dtype])
        constexprs["NUM_SMS"] = NUM_SMS[arch]
    compile_to_cubin(
        kernel, signature=signature, constexprs=constexprs, arch=arch, num_warps=num_warps, num_stages=num_stages,
        serialized_wgmma_ok=_known_serialized(constexprs),
    )  # fmt: skip


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: f"sm{a}")
@pytest.mark.parametrize(
    "dtype, activation",
    [("fp32", SILU), ("fp16", SILU), ("bf16", SILU), ("fp32", GELU_TANH), ("bf16", GELU_TANH)],
    ids=lambda v: v if isinstance(v, str) else {SILU: "silu", GELU_TANH: "gelu_tanh"}[v],
)
def test_grad_kernel_compiles(dtype, activation, arch):
    """The elementwise backward step: one launch shape; dh of any strides (the fp16 case keeps them runtime)."""
    fixed = {} if dtype == "fp16" else {"stride_dhn": 1}
    signature = {"dh_ptr": POINTER[dtype], "g_ptr": POINTER[dtype], "u_ptr": POINTER[dtype]}
    signature.update({i: "i32" for i in ("stride_dhm", "stride_dhn", "stride_gm", "M", "N") if i not in fixed})
    compile_to_cubin(
        _swiglu_grad_kernel,
        signature=signature,
        constexprs=dict(UPCAST=False, ACTIVATION=activation, BLOCK_M=GRAD_BLOCK_M, BLOCK_N=GRAD_BLOCK_N, **fixed),
        arch=arch,
        num_warps=GRAD_NUM_WARPS,
    )


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: f"sm{a}")
@pytest.mark.parametrize(
    "dtype, blocks",
    [("bf16", (128, 128, 8)), ("fp16", (128, 64, 8)), ("fp32", (64, 128, 8)), ("bf16", (64, 64, 8))],
    ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v,
)
def test_weight_grad_reduce_kernel_compiles(dtype, blocks, arch):
    """The partial-sum reduction takes its tile from the weight gradient's config: each
    (BLOCK_K, BLOCK_N, GROUP_K) of weight_grad_configs once, every dtype of dw_gate and dw_up
    (fp32: fp32 weights, or 16-bit ones under autocast; it reads only the fp32 workspace)."""
    block_k, block_n, group_k = blocks
    signature = {"ws_ptr": "*fp32", "dwg_ptr": POINTER[dtype], "dwu_ptr": POINTER[dtype]}
    signature.update({i: "i32" for i in ("stride_dwk", "stride_dwn", "N", "K", "split")})
    constexprs = dict(UPCAST=False, NUM_SMS=NUM_SMS[arch], BLOCK_K=block_k, BLOCK_N=block_n, GROUP_K=group_k)
    constexprs["ROWS"] = min(REDUCE_ROWS, block_k)
    compile_to_cubin(
        _weight_grad_reduce_kernel, signature=signature, constexprs=constexprs, arch=arch, num_warps=REDUCE_NUM_WARPS
    )


def test_reduce_cases_cover_the_weight_grad_tiles():
    if interpreting():
        pytest.skip("the interpreter's config list is not the compiled one")
    tiles = {(c["BLOCK_K"], c["BLOCK_N"], c["GROUP_K"]) for c in autotune_configs(_swiglu_weight_grad_kernel)}
    assert tiles == {(128, 128, 8), (128, 64, 8), (64, 128, 8), (64, 64, 8)}
    tma_tiles = {(c["BLOCK_K"], c["BLOCK_N"], c["GROUP_K"]) for c in autotune_configs(_swiglu_weight_grad_tma_kernel)}
    assert tma_tiles <= tiles


# The Hopper TMA kernels: sm_90 only (the launchers never pick them elsewhere), 16-bit operands,
# every config of each once. Per kernel: its runtime arguments' types for a config's blocks, and a
# case per config index: (operand dtype, output dtype, constexprs besides the config).
def _desc(dtype, rows, cols):
    return f"tensordesc<{dtype}[{rows}, {cols}]>"


def _fwd_tma_signature(c, dtype, out_dtype, transposed=False):
    w_tile = (c["BLOCK_N"], c["BLOCK_K"]) if transposed else (c["BLOCK_K"], c["BLOCK_N"])
    return {
        "x_desc": _desc(dtype, c["BLOCK_M"], c["BLOCK_K"]),
        "wg_desc": _desc(dtype, *w_tile),
        "wu_desc": _desc(dtype, *w_tile),
        **{d: _desc(dtype, c["BLOCK_M"], c["BLOCK_N"]) for d in ("h_desc", "g_desc", "u_desc")},
        **{p: POINTER[dtype] for p in ("bg_ptr", "bu_ptr")},
        **{i: "i32" for i in ("M", "N", "K")},
    }


def _input_grad_tma_signature(c, dtype, out_dtype):
    return {
        "dg_desc": _desc(dtype, c["BLOCK_M"], c["BLOCK_N"]),
        "du_desc": _desc(dtype, c["BLOCK_M"], c["BLOCK_N"]),
        "wg_desc": _desc(dtype, c["BLOCK_K"], c["BLOCK_N"]),
        "wu_desc": _desc(dtype, c["BLOCK_K"], c["BLOCK_N"]),
        "dx_desc": _desc(dtype, c["BLOCK_M"], c["BLOCK_K"]),
        **{i: "i32" for i in ("M", "K", "N")},
    }


def _down_grad_tma_signature(c, dtype, out_dtype):
    return {
        "dy_desc": _desc(dtype, c["BLOCK_M"], c["BLOCK_D"]),
        "wd_desc": _desc(dtype, c["BLOCK_N"], c["BLOCK_D"]),
        **{p: POINTER[dtype] for p in ("g_ptr", "u_ptr", "h_ptr")},
        **{i: "i32" for i in ("stride_gm", "M", "N", "D")},
    }


def _weight_grad_tma_signature(c, dtype, out_dtype):
    return {
        "x_desc": _desc(dtype, c["BLOCK_M"], c["BLOCK_K"]),
        "dg_desc": _desc(dtype, c["BLOCK_M"], c["BLOCK_N"]),
        "du_desc": _desc(dtype, c["BLOCK_M"], c["BLOCK_N"]),
        "dwg_ptr": POINTER[out_dtype],
        "dwu_ptr": POINTER[out_dtype],
        "ws_ptr": "*fp32",
        **{i: "i32" for i in ("stride_dwk", "stride_dwn", "M", "N", "K", "split")},
    }


SM90 = {"NUM_SMS": NUM_SMS[90]}
SM90_ROW_MAJOR = dict(SM90, stride_dwn=1)  # the weight gradients' usual layout
SM90_SILU = dict(SM90, ACTIVATION=SILU, W_TRANSPOSED=False)
TMA_KERNELS = {
    # The forward: biases, saved g/u and fp16 accumulation (FastAccum) each on and off.
    "fwd_tma": (_swiglu_fwd_tma_kernel, _fwd_tma_signature, [
        ("bf16", "bf16", dict(SM90_SILU, HAS_BIAS=False, SAVE_GU=True, ACC_FP16=False)),
        ("fp16", "fp16", dict(SM90_SILU, HAS_BIAS=True, SAVE_GU=False, ACC_FP16=True)),
        ("bf16", "bf16", dict(SM90_SILU, HAS_BIAS=True, SAVE_GU=True, ACC_FP16=False)),
        ("fp16", "fp16", dict(SM90_SILU, HAS_BIAS=False, SAVE_GU=True, ACC_FP16=False)),
    ]),
    # The input gradient: fp16 accumulation where FastAccum asks.
    "input_grad_tma": (_swiglu_input_grad_tma_kernel, _input_grad_tma_signature, [
        ("bf16", "bf16", dict(ACC_FP16=False)),
        ("fp16", "fp16", dict(ACC_FP16=True)),
        ("bf16", "bf16", dict(ACC_FP16=False)),
        ("fp16", "fp16", dict(ACC_FP16=False)),
        ("bf16", "bf16", dict(ACC_FP16=False)),
    ]),
    "down_grad_tma": (_mlp_down_grad_tma_kernel, _down_grad_tma_signature, [
        ("bf16", "bf16", {"ACTIVATION": SILU}), ("fp16", "fp16", {"ACTIVATION": SILU}),
        ("bf16", "bf16", {"ACTIVATION": SILU}), ("fp16", "fp16", {"ACTIVATION": SILU}),
    ]),
    # The weight gradients in the operand dtype or in fp32 (fp32 weights under autocast); the split
    # count a runtime value.
    "weight_grad_tma": (_swiglu_weight_grad_tma_kernel, _weight_grad_tma_signature, [
        ("bf16", "bf16", SM90_ROW_MAJOR), ("fp16", "fp32", SM90_ROW_MAJOR), ("bf16", "fp32", SM90_ROW_MAJOR),
        ("fp16", "fp16", SM90_ROW_MAJOR),
    ]),
}  # fmt: skip
# GELU-tanh in each TMA kernel that evaluates it, on its workhorse config (cfg0).
TMA_GELU_CASES = {
    "fwd_tma": ("bf16", "bf16", dict(SM90_SILU, ACTIVATION=GELU_TANH, HAS_BIAS=True, SAVE_GU=True, ACC_FP16=False)),
    "down_grad_tma": ("bf16", "bf16", {"ACTIVATION": GELU_TANH}),
}


def _tma_params():
    for name, (kernel, _, cases) in TMA_KERNELS.items():
        configs = autotune_configs(kernel)
        assert interpreting() or len(configs) == len(cases), f"{name}: {len(configs)} configs but {len(cases)} cases"
        for index, (config, (dtype, out_dtype, constexprs)) in enumerate(zip(configs, cases)):
            out = "" if out_dtype == dtype else f"-to-{out_dtype}"
            yield pytest.param(name, config, dtype, out_dtype, constexprs, id=f"{name}-cfg{index}-{dtype}{out}-sm90")
    for name, (dtype, out_dtype, constexprs) in TMA_GELU_CASES.items():
        configs = autotune_configs(TMA_KERNELS[name][0])
        yield pytest.param(name, configs[0], dtype, out_dtype, constexprs, id=f"{name}-cfg0-{dtype}-gelu_tanh-sm90")


@pytest.mark.skipif(
    TRITON_VERSION < (3, 4), reason="tensor descriptors need Triton >= 3.4; the pointer kernels are compiled instead"
)
@pytest.mark.parametrize("name, config, dtype, out_dtype, constexprs", list(_tma_params()))
def test_tma_kernels_compile(name, config, dtype, out_dtype, constexprs):
    kernel, signature_of, _ = TMA_KERNELS[name]
    config = dict(config)
    num_warps, num_stages = config.pop("num_warps"), config.pop("num_stages")
    compile_to_cubin(
        kernel,
        signature={k: v for k, v in signature_of(config, dtype, out_dtype).items() if k not in constexprs},
        constexprs=dict(constexprs, UPCAST=False, **config),
        arch=90,
        num_warps=num_warps,
        num_stages=num_stages,
        serialized_wgmma_ok=_known_serialized(constexprs),
    )


@pytest.mark.parametrize("arch, tma", [(80, False), (90, False), (90, True)], ids=["sm80", "sm90", "sm90-tma"])
def test_column_major_weight_grads_compile(arch, tma):
    """fp32 weight gradients stored in the (1, K) strides of an nn.Linear weight's transposed view
    (stride_dwk = 1, a transposing store), bf16 operands, each kernel's first config."""
    if tma and TRITON_VERSION < (3, 4):
        pytest.skip("tensor descriptors need Triton >= 3.4")
    kernel = _swiglu_weight_grad_tma_kernel if tma else _swiglu_weight_grad_kernel
    config = dict(autotune_configs(kernel)[0])
    num_warps, num_stages = config.pop("num_warps"), config.pop("num_stages")
    constexprs = dict(config, UPCAST=False, NUM_SMS=NUM_SMS[arch], stride_dwk=1)
    if tma:
        signature = _weight_grad_tma_signature(config, "bf16", "fp32")
    else:
        _, pointers, ints, _ = KERNELS["weight_grad"]
        signature = {p: POINTER["bf16"] for p in pointers}
        signature.update({i: "i32" for i in ints}, ws_ptr="*fp32", dwg_ptr="*fp32", dwu_ptr="*fp32")
        constexprs.update(stride_xk=1, ALLOW_TF32=False, EVEN_M=True)
    signature = {k: v for k, v in signature.items() if k not in constexprs}
    compile_to_cubin(kernel, signature=signature, constexprs=constexprs, arch=arch, num_warps=num_warps,
                     num_stages=num_stages)  # fmt: skip


@pytest.mark.skipif(TRITON_VERSION < (3, 4), reason="tensor descriptors need Triton >= 3.4")
@pytest.mark.parametrize("index", [0, 1], ids=["cfg0", "cfg1"])
def test_tma_forward_of_linear_weight_views_compiles(index):
    """W_TRANSPOSED: the weights' (BLOCK_N, BLOCK_K) tiles of (N, K) rows, transposed in shared
    memory for the wgmma (which must stay asynchronous: the serialized-wgmma check)."""
    config = dict(autotune_configs(_swiglu_fwd_tma_kernel)[index])
    num_warps, num_stages = config.pop("num_warps"), config.pop("num_stages")
    constexprs = dict(SM90_SILU, HAS_BIAS=False, SAVE_GU=True, ACC_FP16=False, UPCAST=False, **config)
    constexprs["W_TRANSPOSED"] = True
    compile_to_cubin(
        _swiglu_fwd_tma_kernel, signature=_fwd_tma_signature(config, "bf16", "bf16", transposed=True),
        constexprs=constexprs, arch=90, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
