"""Rotation helpers shared by both RoPE kernels.

A rotary pair is two columns of a head, (j, j + d2/2) for rotate-half (GPT-NeoX / LLaMA) or
(2j, 2j + 1) for interleaved (GPT-J). Each member has its own angle, as in TransformerEngine
(whose `freqs` may differ between the members of a pair), so one pair is transformed by

    forward   y1 = x1 cos1 - x2 sin1        backward (the transpose, the exact gradient)
              y2 = x2 cos2 + x1 sin2                  dx1 = dy1 cos1 + dy2 sin2
                                                      dx2 = dy2 cos2 - dy1 sin1

which for equal angles is a rotation and its inverse. A program transforms a tile of BLOCK_R
rows (heads) of one token: every element is read once and written once, all loads are issued
before the first store, values are upcast to fp32 after loading and rounded once when stored.
Row offsets are int64, so tensors past 2^31 elements are addressed correctly. HALF (d2 / 2)
and HEAD_DIM are compile-time so that the compiler sees the alignment of every column offset
(HALF = 40 is a multiple of 8: 16-byte bf16 vectors) and drops masks that are always true.

Two ways to gather the members of a pair:
- `_rope_rows`: two loads, columns col1 and col2 (contiguous vectors for rotate-half; stride-2
  scalar loads for interleaved pairs, the portable path that Triton 2.2 compiles);
- `_rope_rows_interleaved`: one contiguous load of the 2 * HALF rotary columns, pairs split
  and joined in registers with tl.split / tl.join (Triton >= 3: vector loads and stores).
Columns past 2 * HALF pass through: copied when COPY_PASS, else untouched (in place, or none).
"""

import triton
import triton.language as tl


@triton.jit
def _pair_columns(offs_p, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Columns of the first and second member of pairs `offs_p` (head dim contiguous)."""
    if INTERLEAVED:
        col1 = 2 * offs_p
        col2 = col1 + 1
    else:
        col1 = offs_p
        col2 = offs_p + HALF
    return col1, col2


@triton.jit
def _rotate(x1, x2, cos1, sin1, cos2, sin2, TRANSPOSE: tl.constexpr):
    """The pair transform above: forward, or its transpose (backward) when TRANSPOSE."""
    if TRANSPOSE:
        y1 = x1 * cos1 + x2 * sin2
        y2 = x2 * cos2 - x1 * sin1
    else:
        y1 = x1 * cos1 - x2 * sin1
        y2 = x2 * cos2 + x1 * sin2
    return y1, y2


@triton.jit
def _pass_offsets(rows, row_mask, HALF: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_PASS: tl.constexpr):
    """Offsets and mask of the pass-through columns 2 * HALF .. HEAD_DIM of each row."""
    offs_c = 2 * HALF + tl.arange(0, BLOCK_PASS)
    return rows[:, None] + offs_c[None, :], row_mask[:, None] & (offs_c < HEAD_DIM)[None, :]


@triton.jit
def _rope_rows(
    x_ptr,
    y_ptr,
    x_rows,
    y_rows,
    row_mask,
    cos1,
    sin1,
    cos2,
    sin2,
    HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    TRANSPOSE: tl.constexpr,
    COPY_PASS: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    """Transform BLOCK_R rows, pair members gathered by two loads.

    x_rows, y_rows: (BLOCK_R,) int64 offsets of each row's first element in x and y.
    cos*, sin*: fp32, broadcastable to (BLOCK_R, BLOCK_P): each pair member's angle.
    """
    offs_p = tl.arange(0, BLOCK_P)
    col1, col2 = _pair_columns(offs_p, HALF, INTERLEAVED)
    mask = row_mask[:, None] & (offs_p < HALF)[None, :]
    x1 = tl.load(x_ptr + (x_rows[:, None] + col1[None, :]), mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + (x_rows[:, None] + col2[None, :]), mask=mask, other=0.0).to(tl.float32)
    if COPY_PASS:
        x_pass_offs, pass_mask = _pass_offsets(x_rows, row_mask, HALF, HEAD_DIM, BLOCK_PASS)
        x_pass = tl.load(x_ptr + x_pass_offs, mask=pass_mask)
    y1, y2 = _rotate(x1, x2, cos1, sin1, cos2, sin2, TRANSPOSE)
    out_dtype = y_ptr.dtype.element_ty
    tl.store(y_ptr + (y_rows[:, None] + col1[None, :]), y1.to(out_dtype), mask=mask)
    tl.store(y_ptr + (y_rows[:, None] + col2[None, :]), y2.to(out_dtype), mask=mask)
    if COPY_PASS:
        y_pass_offs, pass_mask = _pass_offsets(y_rows, row_mask, HALF, HEAD_DIM, BLOCK_PASS)
        tl.store(y_ptr + y_pass_offs, x_pass, mask=pass_mask)


@triton.jit
def _rotate_interleaved(x, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr):
    """rot(x) for interleaved pairs: columns (2j, 2j + 1) become (-x[2j + 1], x[2j]).

    split / join exist from Triton 3.0. They are spelled triton.language.* because Triton 2.2
    resolves every tl.<name> of a kernel's call tree when it hashes the kernel, even in
    branches it never compiles; it skips names under `triton.`.
    """
    even, odd = triton.language.split(tl.reshape(x, [BLOCK_R, BLOCK_P, 2]))
    return tl.reshape(triton.language.join(-odd, even), [BLOCK_R, 2 * BLOCK_P])


@triton.jit
def _rope_rows_interleaved(
    x_ptr,
    y_ptr,
    x_rows,
    y_rows,
    row_mask,
    cos,
    sin,
    HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    TRANSPOSE: tl.constexpr,
    COPY_PASS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    """Transform BLOCK_R rows of interleaved pairs from one contiguous load (Triton >= 3).

    cos, sin: fp32 (1, 2 * BLOCK_P): the cos/sin of each rotary column's own angle. With
    rot(x) = (-x[2j + 1], x[2j]) per pair, the transform above reads
    y = x * cos + rot(x) * sin and its transpose dx = dy * cos - rot(dy * sin).
    """
    offs_d = tl.arange(0, 2 * BLOCK_P)
    mask = row_mask[:, None] & (offs_d < 2 * HALF)[None, :]
    x = tl.load(x_ptr + (x_rows[:, None] + offs_d[None, :]), mask=mask, other=0.0).to(tl.float32)
    if COPY_PASS:
        x_pass_offs, pass_mask = _pass_offsets(x_rows, row_mask, HALF, HEAD_DIM, BLOCK_PASS)
        x_pass = tl.load(x_ptr + x_pass_offs, mask=pass_mask)
    if TRANSPOSE:
        y = x * cos - _rotate_interleaved(x * sin, BLOCK_R, BLOCK_P)
    else:
        y = x * cos + _rotate_interleaved(x, BLOCK_R, BLOCK_P) * sin
    tl.store(y_ptr + (y_rows[:, None] + offs_d[None, :]), y.to(y_ptr.dtype.element_ty), mask=mask)
    if COPY_PASS:
        y_pass_offs, pass_mask = _pass_offsets(y_rows, row_mask, HALF, HEAD_DIM, BLOCK_PASS)
        tl.store(y_ptr + y_pass_offs, x_pass, mask=pass_mask)
