"""Every kernel specialization the launchers choose compiles to a cubin (sm_80, sm_90).

A covering set, not the cross product: each case is what the launcher's own `launch_plan`
picks for a representative shape, and together they give every compile-time value (formats,
start positions, interleaved with and without tl.split, pass-through copied or not, in place,
position ids, q and k in one program or not) and every dtype at least once, plus tiles from
1 to 16 warps (head dims 64 to 512, rotary dims 40 to 512), and inputs whose columns are not
contiguous (the column stride a runtime integer instead of the constant 1). The direction (forward
or its transpose) is a runtime argument: one kernel serves both.
"""

import pytest
from tritonformer_testkit.aot import ARCHS, compile_to_cubin

from fused_rope import _compat
from fused_rope.kernels.rope import _rope_kernel
from fused_rope.kernels.rope_qk import _rope_qk_kernel
from fused_rope.ops import rope as rope_ops
from fused_rope.ops import rope_qk as rope_qk_ops

pytestmark = pytest.mark.aot

ELEMENT_SIZE = {"fp32": 4, "fp16": 2, "bf16": 2}
SPLIT = _compat.HAS_SPLIT_JOIN

# tensor_format, t dtype, freqs dtype, head_dim, d2, heads, batch, interleaved, split pairs,
# start_positions dtype, cu_seqlens dtype, integer argument type
ROPE_CASES = [
    ("sbhd", "bf16", "fp32", 128, 128, 32, 4, False, False, None, None, "i32"),
    ("bshd", "fp16", "fp32", 128, 64, 16, 2, True, SPLIT, "i64", None, "i32"),
    ("thd", "fp32", "fp32", 256, 256, 8, 1, True, SPLIT, "i32", "i32", "i32"),
    ("sbhd", "bf16", "fp32", 512, 256, 64, 2, False, False, None, None, "i64"),
    ("thd", "bf16", "fp32", 80, 40, 4, 1, False, False, None, "i64", "i32"),
    ("sbhd", "fp32", "bf16", 96, 96, 12, 1, True, SPLIT, None, None, "i32"),
    ("bshd", "bf16", "fp32", 64, 32, 2, 1, False, False, "i32", None, "i32"),
    ("sbhd", "fp16", "fp32", 128, 128, 8, 2, True, False, None, None, "i32"),
]
ROPE_INTS = ["stride_t_s", "stride_t_b", "stride_t_h", "stride_out_s", "stride_out_b", "stride_out_h",
             "stride_freqs_s", "n_batch_groups", "n_heads", "n_rows", "n_seqs", "search_steps",
             "transpose"]  # fmt: skip
# The input's column stride: 1 (the JIT makes it a constant) in every case but these, where it is a
# runtime integer (an expanded gradient, a strided last dim).
ROPE_STRIDED_COLUMNS = {5, 6}

# q/k dtype, cos/sin dtype, head_dim, d2, q heads, k heads, in place, position_ids dtype
QK_CASES = [
    ("bf16", "bf16", 128, 128, 32, 8, False, None),
    ("fp16", "fp32", 128, 64, 16, 16, True, "i64"),
    ("fp32", "fp32", 256, 256, 8, 2, False, None),
    ("bf16", "fp32", 80, 40, 12, 4, False, "i32"),
    ("bf16", "bf16", 64, 64, 1, 1, False, None),
    ("bf16", "bf16", 128, 128, 8, 8, False, None),
    ("bf16", "bf16", 512, 512, 32, 32, False, None),
]
QK_STRIDES = [f"stride_{name}_{dim}" for name in ("q", "k", "q_out", "k_out") for dim in "bhs"]
QK_STRIDED_COLUMNS = {3, 5}
QK_INTS = [*QK_STRIDES, "stride_table_b", "stride_table_s", "stride_pos_b", "seq_len", "n_q_heads", "n_k_heads",
           "transpose"]  # fmt: skip


def _rope_choice(case):
    """What the launcher picks for a ROPE_CASES case (rows: heads, times batch unless thd / start positions)."""
    fmt, dtype, _, head_dim, d2, heads, batch, interleaved, split, start, _, _ = case
    n_rows = heads if fmt == "thd" or start else heads * batch
    return rope_ops.kernel_config(fmt == "thd", n_rows, d2, head_dim, ELEMENT_SIZE[dtype], interleaved, split,
                                  start is not None)  # fmt: skip


def _qk_choice(case):
    dtype, _, head_dim, d2, q_heads, k_heads, in_place, position_ids = case
    return rope_qk_ops.kernel_config(q_heads, k_heads, d2, head_dim, ELEMENT_SIZE[dtype], in_place,
                                     position_ids is not None)  # fmt: skip


def _column_strides(names, strided, int_type):
    """The column stride arguments: runtime integers where `strided`, else the constant 1 (as the JIT passes)."""
    return ({name: int_type for name in names}, {}) if strided else ({}, {name: 1 for name in names})


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", ROPE_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_rope_kernel_compiles(case, arch):
    _, dtype, freqs_dtype, _, _, _, _, _, _, start, cu, int_type = case
    choice = _rope_choice(case)
    columns, constant_columns = _column_strides(
        ["stride_t_d"], ROPE_CASES.index(case) in ROPE_STRIDED_COLUMNS, int_type
    )
    signature = {
        "t_ptr": f"*{dtype}",
        "freqs_ptr": f"*{freqs_dtype}",
        "out_ptr": f"*{dtype}",
        "start_ptr": f"*{start or dtype}",
        "cu_seqlens_ptr": f"*{cu or dtype}",
        **{name: int_type for name in ROPE_INTS},
        **columns,
    }
    constexprs = {**choice.constexprs, **constant_columns}
    compile_to_cubin(_rope_kernel, signature=signature, constexprs=constexprs, arch=arch, num_warps=choice.num_warps)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", QK_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_rope_qk_kernel_compiles(case, arch):
    dtype, table_dtype, _, _, _, _, in_place, position_ids = case
    choice = _qk_choice(case)
    strided = QK_CASES.index(case) in QK_STRIDED_COLUMNS and not in_place
    columns, constant_columns = _column_strides(["stride_q_d", "stride_k_d"], strided, "i32")
    signature = {
        **{name: f"*{dtype}" for name in ("q_ptr", "k_ptr", "q_out_ptr", "k_out_ptr")},
        "cos_ptr": f"*{table_dtype}",
        "sin_ptr": f"*{table_dtype}",
        "position_ids_ptr": f"*{position_ids or dtype}",
        **{name: "i32" for name in QK_INTS},
        **columns,
    }
    constexprs = {**choice.constexprs, **constant_columns}
    compile_to_cubin(_rope_qk_kernel, signature=signature, constexprs=constexprs, arch=arch, num_warps=choice.num_warps)


def test_the_covering_set_covers_every_compile_time_value():
    """Each constexpr value and each num_warps the cases pick, as the docstring promises."""
    choices = [_rope_choice(c) for c in ROPE_CASES]
    metas = [c.constexprs for c in choices]
    for flag in ("IS_THD", "HAS_START", "INTERLEAVED"):
        assert {m[flag] for m in metas} == {False, True}, flag
    assert {m["SPLIT_PAIRS"] for m in metas} == ({False, True} if SPLIT else {False})
    qk_choices = [_qk_choice(c) for c in QK_CASES]
    qk_metas = [c.constexprs for c in qk_choices]
    assert {m["HAS_POSITION_IDS"] for m in qk_metas} == {False, True}
    assert {m["QK_TOGETHER"] for m in qk_metas} == {False, True}
    for group in (metas, qk_metas):  # pass-through columns copied (BLOCK_PASS > 1) and not
        assert {m["BLOCK_PASS"] > 1 for m in group} == {False, True}
    assert {c.num_warps for c in choices + qk_choices} >= {1, 2, 4, 8, 16}
    # strided input columns: pairs split in registers (where tl.split exists) and loaded apart,
    # pass-through columns; q and k in one program and not
    strided = [ROPE_CASES[i] for i in ROPE_STRIDED_COLUMNS]
    assert {c[8] for c in strided} == ({False, True} if SPLIT else {False}) and any(c[4] < c[3] for c in strided)
    strided_qk = [qk_metas[i] for i in QK_STRIDED_COLUMNS if not QK_CASES[i][6]]
    assert {m["QK_TOGETHER"] for m in strided_qk} == {False, True} and any(m["BLOCK_PASS"] > 1 for m in strided_qk)
