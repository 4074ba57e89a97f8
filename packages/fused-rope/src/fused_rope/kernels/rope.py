"""TransformerEngine-style RoPE: angles `freqs` (s2, 1, 1, d2), formats sbhd / bshd / thd.

Grid: (position groups, row blocks). A program takes one position (one token for thd) and a
block of BLOCK_R rows, a row being one head of one batch entry, as a 2-D (BLOCK_R, BLOCK_P)
tile of pairs plus a (BLOCK_R, BLOCK_PASS) tile of pass-through columns. The angles of a
position are loaded once per program and their cos/sin (fp32, accurate) are shared by every
row of the tile:
- sbhd / bshd without start positions: all rows of a position share its angles, so the rows
  span the batch (row = b * heads + h) and a program's tile can be as tall as batch x heads;
- with start positions each batch entry has its own angle row: a program covers one batch
  entry (n_batch_groups = batch) and its rows are heads;
- thd: a program covers one token; its sequence is found by binary search in cu_seqlens
  (search_steps = ceil(log2(n_seqs)) scalar loads), its position is token - cu_seqlens[seq]
  (+ start_positions[seq]).
The launcher checks every position against s2 before launching, so `freqs` is never read out
of bounds. `transpose` = 1 applies the backward (transposed) transform to a gradient. SPLIT_PAIRS
(interleaved pairs on Triton >= 3) loads the rotary columns contiguously and the angles as one
row; otherwise the two members of each pair and their angles are loaded separately.
"""

import triton
import triton.language as tl

from .common import (
    _load_pairs,
    _load_pass,
    _load_rotary,
    _pair_columns,
    _pair_sines,
    _rotate,
    _rotate_interleaved,
    _store_pairs,
    _store_pass,
    _store_rotary,
)


@triton.jit
def _find_sequence(cu_seqlens_ptr, token, n_seqs, search_steps):
    """Largest i with cu_seqlens[i] <= token (the sequence holding it, empty sequences skipped)."""
    lo = tl.full([], 0, tl.int32)
    hi = tl.full([], 0, tl.int32) + n_seqs
    # Invariant: cu_seqlens[lo] <= token < cu_seqlens[hi].
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        go_right = tl.load(cu_seqlens_ptr + mid) <= token
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid)
    return lo


@triton.jit(do_not_specialize=["n_batch_groups", "n_heads", "n_rows", "n_seqs", "search_steps", "transpose"])
def _rope_kernel(
    # pointers
    t_ptr,
    freqs_ptr,
    out_ptr,
    start_ptr,
    cu_seqlens_ptr,
    # strides, in elements (the head dim of out and freqs is contiguous; t's columns are stride_t_d apart)
    stride_t_s,
    stride_t_b,
    stride_t_h,
    stride_t_d,
    stride_out_s,
    stride_out_b,
    stride_out_h,
    stride_freqs_s,
    # sizes
    n_batch_groups,
    n_heads,
    n_rows,
    n_seqs,
    search_steps,
    # 0: the forward transform; 1: its transpose (the backward)
    transpose,
    # meta-parameters
    HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    IS_THD: tl.constexpr,
    HAS_START: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SPLIT_PAIRS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    # The pass-through columns (d2 < head_dim) are copied through a (BLOCK_R, BLOCK_PASS) tile;
    # without any, BLOCK_PASS is 1.
    COPY_PASS: tl.constexpr = BLOCK_PASS > 1
    pid_g = tl.program_id(0)
    pid_r = tl.program_id(1)
    if IS_THD:
        index_s = pid_g
        batch = 0
    else:
        index_s = pid_g // n_batch_groups
        batch = pid_g % n_batch_groups
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = offs_r < n_rows
    row_b = (offs_r // n_heads + batch).to(tl.int64)
    row_h = (offs_r % n_heads).to(tl.int64)
    t_rows = index_s.to(tl.int64) * stride_t_s + row_b * stride_t_b + row_h * stride_t_h
    out_rows = index_s.to(tl.int64) * stride_out_s + row_b * stride_out_b + row_h * stride_out_h

    # Loads first: the tile (one read of every element) needs only the token, so it is in
    # flight while the position is found (a binary search for thd) and while the cos/sin of
    # the position's angles are computed (fp32, accurate, once per angle, shared by the rows).
    if COPY_PASS:
        t_pass = _load_pass(t_ptr, t_rows, row_mask, stride_t_d, HALF, HEAD_DIM, BLOCK_PASS)
    if SPLIT_PAIRS:
        x = _load_rotary(t_ptr, t_rows, row_mask, stride_t_d, HALF, BLOCK_P)
    else:
        x1, x2 = _load_pairs(t_ptr, t_rows, row_mask, stride_t_d, HALF, INTERLEAVED, BLOCK_P)

    if IS_THD:
        seq = _find_sequence(cu_seqlens_ptr, pid_g, n_seqs, search_steps)
        pos = pid_g - tl.load(cu_seqlens_ptr + seq).to(tl.int32)
        if HAS_START:
            pos += tl.load(start_ptr + seq).to(tl.int32)
    else:
        pos = index_s
        if HAS_START:
            pos += tl.load(start_ptr + batch).to(tl.int32)
    freqs_row = freqs_ptr + pos.to(tl.int64) * stride_freqs_s

    if SPLIT_PAIRS:
        offs_d = tl.arange(0, 2 * BLOCK_P)
        mask_d = offs_d < 2 * HALF
        angle = tl.load(freqs_row + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        # The transpose takes each member's sine from its partner (column 2j <-> 2j + 1), negated.
        sin_angle = tl.load(freqs_row + (offs_d ^ transpose), mask=mask_d, other=0.0).to(tl.float32)
        cos, sin = tl.cos(angle)[None, :], (tl.sin(sin_angle) * (1 - 2 * transpose))[None, :]
        y = x * cos + _rotate_interleaved(x, BLOCK_R, BLOCK_P) * sin
        _store_rotary(out_ptr, out_rows, row_mask, y, HALF, BLOCK_P)
    else:
        offs_p = tl.arange(0, BLOCK_P)
        col1, col2 = _pair_columns(offs_p, HALF, INTERLEAVED)
        angle1 = tl.load(freqs_row + col1, mask=offs_p < HALF, other=0.0).to(tl.float32)
        angle2 = tl.load(freqs_row + col2, mask=offs_p < HALF, other=0.0).to(tl.float32)
        sin_a, sin_b = _pair_sines(tl.sin(angle1), tl.sin(angle2), transpose)
        y1, y2 = _rotate(x1, x2, tl.cos(angle1)[None, :], sin_a[None, :], tl.cos(angle2)[None, :], sin_b[None, :])
        _store_pairs(out_ptr, out_rows, row_mask, y1, y2, HALF, INTERLEAVED, BLOCK_P)
    if COPY_PASS:
        _store_pass(out_ptr, out_rows, row_mask, t_pass, HALF, HEAD_DIM, BLOCK_PASS)
