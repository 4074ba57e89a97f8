"""Hugging Face / Liger-style RoPE of q and k in one launch: tables cos, sin (B or 1, P, d2).

Grid: (batch x seq tokens, q row blocks + k row blocks). A program takes one token and a block
of BLOCK_R heads of q (program ids below n_q_blocks) or of k (the rest), so GQA head counts
need nothing special. With QK_TOGETHER (q's and k's heads each fit one block) a program takes
all of the token's heads of both, grid (tokens, 1): one table row load per token instead of
two, and twice the bytes per program when the heads are few. The token's cos/sin row is
loaded once per program (table row `position_ids[b, s]`, or `s` without position ids) and
shared by the heads of the program. Rotate-half pairs (j, j + d2/2), the rest of the head
passes through (copied when the output is a new tensor, untouched in place). `transpose` = 1
applies the backward transform.
"""

import triton
import triton.language as tl

from .common import _load_pairs, _load_pass, _pair_sines, _rotate, _store_pairs, _store_pass


@triton.jit
def _rope_qk_head_block(
    x_ptr,
    y_ptr,
    batch,
    index_s,
    block,
    stride_x_b,
    stride_x_h,
    stride_x_s,
    stride_x_d,
    stride_y_b,
    stride_y_h,
    stride_y_s,
    n_heads,
    cos1,
    sin_a,
    cos2,
    sin_b,
    HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    COPY_PASS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    """Heads [block * BLOCK_R, (block + 1) * BLOCK_R) of token (batch, index_s) of one tensor."""
    heads = block * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = heads < n_heads
    heads = heads.to(tl.int64)
    x_rows = batch * stride_x_b + index_s * stride_x_s + heads * stride_x_h
    y_rows = batch * stride_y_b + index_s * stride_y_s + heads * stride_y_h
    if COPY_PASS:
        x_pass = _load_pass(x_ptr, x_rows, row_mask, stride_x_d, HALF, HEAD_DIM, BLOCK_PASS)
    x1, x2 = _load_pairs(x_ptr, x_rows, row_mask, stride_x_d, HALF, False, BLOCK_P)
    y1, y2 = _rotate(x1, x2, cos1, sin_a, cos2, sin_b)
    _store_pairs(y_ptr, y_rows, row_mask, y1, y2, HALF, False, BLOCK_P)
    if COPY_PASS:
        _store_pass(y_ptr, y_rows, row_mask, x_pass, HALF, HEAD_DIM, BLOCK_PASS)


@triton.jit(do_not_specialize=["seq_len", "n_q_heads", "n_k_heads", "transpose"])
def _rope_qk_kernel(
    # pointers
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    position_ids_ptr,
    q_out_ptr,
    k_out_ptr,
    # strides, in elements (the columns of q and k are stride_q_d / stride_k_d apart, the head dim of
    # the outputs and tables is contiguous; cos and sin share their strides; position_ids is
    # contiguous (batch or 1, seq))
    stride_q_b,
    stride_q_h,
    stride_q_s,
    stride_q_d,
    stride_k_b,
    stride_k_h,
    stride_k_s,
    stride_k_d,
    stride_q_out_b,
    stride_q_out_h,
    stride_q_out_s,
    stride_k_out_b,
    stride_k_out_h,
    stride_k_out_s,
    stride_table_b,
    stride_table_s,
    stride_pos_b,
    # sizes
    seq_len,
    n_q_heads,
    n_k_heads,
    # 0: the forward transform; 1: its transpose (the backward)
    transpose,
    # meta-parameters
    HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_POSITION_IDS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    QK_TOGETHER: tl.constexpr,
):
    # The pass-through columns are copied when there is a tile for them (new tensors with
    # d2 < head_dim); in place, or with d2 == head_dim, BLOCK_PASS is 1 and they are not touched.
    COPY_PASS: tl.constexpr = BLOCK_PASS > 1
    pid_g = tl.program_id(0)
    pid_r = tl.program_id(1)
    batch = (pid_g // seq_len).to(tl.int64)
    index_s = (pid_g % seq_len).to(tl.int64)
    if HAS_POSITION_IDS:
        pos = tl.load(position_ids_ptr + batch * stride_pos_b + index_s).to(tl.int64)
    else:
        pos = index_s

    offs_p = tl.arange(0, BLOCK_P)
    pair_mask = offs_p < HALF
    table_row = batch * stride_table_b + pos * stride_table_s + offs_p
    cos1 = tl.load(cos_ptr + table_row, mask=pair_mask, other=0.0).to(tl.float32)[None, :]
    cos2 = tl.load(cos_ptr + table_row + HALF, mask=pair_mask, other=0.0).to(tl.float32)[None, :]
    sin1 = tl.load(sin_ptr + table_row, mask=pair_mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_ptr + table_row + HALF, mask=pair_mask, other=0.0).to(tl.float32)
    sin_a, sin_b = _pair_sines(sin1, sin2, transpose)
    sin_a, sin_b = sin_a[None, :], sin_b[None, :]

    n_q_blocks = tl.cdiv(n_q_heads, BLOCK_R)
    if QK_TOGETHER:
        k_block = pid_r
    else:
        k_block = pid_r - n_q_blocks
    if (pid_r < n_q_blocks) | QK_TOGETHER:
        _rope_qk_head_block(
            q_ptr, q_out_ptr, batch, index_s, pid_r, stride_q_b, stride_q_h, stride_q_s, stride_q_d,
            stride_q_out_b, stride_q_out_h, stride_q_out_s, n_q_heads, cos1, sin_a, cos2, sin_b,
            HALF, HEAD_DIM, COPY_PASS, BLOCK_R, BLOCK_P, BLOCK_PASS,
        )  # fmt: skip
    if (pid_r >= n_q_blocks) | QK_TOGETHER:
        _rope_qk_head_block(
            k_ptr, k_out_ptr, batch, index_s, k_block, stride_k_b, stride_k_h, stride_k_s, stride_k_d,
            stride_k_out_b, stride_k_out_h, stride_k_out_s, n_k_heads, cos1, sin_a, cos2, sin_b,
            HALF, HEAD_DIM, COPY_PASS, BLOCK_R, BLOCK_P, BLOCK_PASS,
        )  # fmt: skip
