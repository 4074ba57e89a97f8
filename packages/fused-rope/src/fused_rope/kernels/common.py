"""Rotation helpers shared by both RoPE kernels.

A rotary pair is two columns of a head, (j, j + d2/2) for rotate-half (GPT-NeoX / LLaMA) or
(2j, 2j + 1) for interleaved (GPT-J). Each member has its own angle, as in TransformerEngine
(whose `freqs` may differ between the members of a pair), so one pair is transformed by

    forward   y1 = x1 cos1 - x2 sin1        backward (the transpose, the exact gradient)
              y2 = x2 cos2 + x1 sin2                  dx1 = dy1 cos1 + dy2 sin2
                                                      dx2 = dy2 cos2 - dy1 sin1

which for equal angles is a rotation and its inverse. Both are

              y1 = x1 cos1 - x2 sin_a,  y2 = x2 cos2 + x1 sin_b

with (sin_a, sin_b) = (sin1, sin2) forward and (-sin2, -sin1) backward: the direction is a
runtime argument `transpose` that only picks, on a program's 1-D vectors of sines, which
sine goes where, so the forward and the backward are one compiled kernel (half the
specializations to compile) at no cost per element. A program transforms a tile of BLOCK_R
rows (heads) of one token: every element is read once and written once, all loads are issued
before the first store, values are upcast to fp32 after loading and rounded once when stored.
Row offsets are int64, so tensors past 2^31 elements are addressed correctly. HALF (d2 / 2)
and HEAD_DIM are compile-time so that the compiler sees the alignment of every column offset
(HALF = 40 is a multiple of 8: 16-byte bf16 vectors) and drops masks that are always true.

The kernels load a tile, then compute, then store, with these helpers (loads first, so that a
kernel's angle arithmetic overlaps the loads in flight). Two ways to gather pair members:
- `_load_pairs` / `_store_pairs`: two loads, columns col1 and col2 (contiguous vectors for
  rotate-half; stride-2 scalar loads for interleaved pairs, the portable path that Triton 2.2
  compiles);
- `_load_rotary` / `_store_rotary` with `_rotate_interleaved`: one contiguous load of the
  2 * HALF rotary columns, pairs split and joined in registers with tl.split / tl.join
  (Triton >= 3: vector loads and stores for interleaved pairs).
Columns past 2 * HALF pass through (`_load_pass` / `_store_pass`): copied when the output is a
new tensor, untouched in place. Inputs are read with their column stride (`stride_x_d`: 0 for the
expanded gradient of a sum, 2 for every other column of a wider buffer), so no layout needs a copy
first; a stride of 1 is what the JIT then compiles as a constant, to the same contiguous vector
loads as a kernel without the argument. Outputs are written with unit column stride.
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
def _pair_sines(sin1, sin2, transpose):
    """(sin_a, sin_b) of the pair transform: (sin1, sin2), or (-sin2, -sin1) when transpose != 0."""
    flip = transpose != 0
    return tl.where(flip, -sin2, sin1), tl.where(flip, -sin1, sin2)


@triton.jit
def _rotate(x1, x2, cos1, sin_a, cos2, sin_b):
    """The pair transform above, given the sines _pair_sines picked."""
    y1 = x1 * cos1 - x2 * sin_a
    y2 = x2 * cos2 + x1 * sin_b
    return y1, y2


@triton.jit
def _pass_offsets(rows, row_mask, stride_d, HALF: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_PASS: tl.constexpr):
    """Offsets and mask of the pass-through columns 2 * HALF .. HEAD_DIM of each row (columns stride_d apart)."""
    offs_c = 2 * HALF + tl.arange(0, BLOCK_PASS)
    return rows[:, None] + offs_c[None, :] * stride_d, row_mask[:, None] & (offs_c < HEAD_DIM)[None, :]


@triton.jit
def _load_pass(
    x_ptr, x_rows, row_mask, stride_x_d, HALF: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_PASS: tl.constexpr
):
    """(BLOCK_R, BLOCK_PASS) pass-through tile, in x's dtype."""
    offs, mask = _pass_offsets(x_rows, row_mask, stride_x_d, HALF, HEAD_DIM, BLOCK_PASS)
    return tl.load(x_ptr + offs, mask=mask)


@triton.jit
def _store_pass(y_ptr, y_rows, row_mask, x_pass, HALF: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_PASS: tl.constexpr):
    offs, mask = _pass_offsets(y_rows, row_mask, 1, HALF, HEAD_DIM, BLOCK_PASS)
    tl.store(y_ptr + offs, x_pass, mask=mask)


@triton.jit
def _pair_offsets(rows, row_mask, stride_d, HALF: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_P: tl.constexpr):
    """Offsets of the first and second pair members of each row (columns stride_d apart), and their mask."""
    offs_p = tl.arange(0, BLOCK_P)
    col1, col2 = _pair_columns(offs_p, HALF, INTERLEAVED)
    mask = row_mask[:, None] & (offs_p < HALF)[None, :]
    return rows[:, None] + col1[None, :] * stride_d, rows[:, None] + col2[None, :] * stride_d, mask


@triton.jit
def _load_pairs(
    x_ptr, x_rows, row_mask, stride_x_d, HALF: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_P: tl.constexpr
):
    """(BLOCK_R, BLOCK_P) tiles of the first and second pair members, fp32.

    x_rows: (BLOCK_R,) int64 offsets of each row's first element; row_mask: rows that exist.
    """
    offs1, offs2, mask = _pair_offsets(x_rows, row_mask, stride_x_d, HALF, INTERLEAVED, BLOCK_P)
    x1 = tl.load(x_ptr + offs1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + offs2, mask=mask, other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def _store_pairs(y_ptr, y_rows, row_mask, y1, y2, HALF: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_P: tl.constexpr):
    """Round y1, y2 (fp32) to y's dtype once and store them where _load_pairs read."""
    offs1, offs2, mask = _pair_offsets(y_rows, row_mask, 1, HALF, INTERLEAVED, BLOCK_P)
    tl.store(y_ptr + offs1, y1.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + offs2, y2.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_offsets(rows, row_mask, stride_d, HALF: tl.constexpr, BLOCK_P: tl.constexpr):
    offs_d = tl.arange(0, 2 * BLOCK_P)
    return rows[:, None] + offs_d[None, :] * stride_d, row_mask[:, None] & (offs_d < 2 * HALF)[None, :]


@triton.jit
def _load_rotary(x_ptr, x_rows, row_mask, stride_x_d, HALF: tl.constexpr, BLOCK_P: tl.constexpr):
    """(BLOCK_R, 2 * BLOCK_P) tile of the rotary columns 0 .. 2 * HALF, one load (contiguous when
    stride_x_d is 1), fp32."""
    offs, mask = _rotary_offsets(x_rows, row_mask, stride_x_d, HALF, BLOCK_P)
    return tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_rotary(y_ptr, y_rows, row_mask, y, HALF: tl.constexpr, BLOCK_P: tl.constexpr):
    offs, mask = _rotary_offsets(y_rows, row_mask, 1, HALF, BLOCK_P)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotate_interleaved(x, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr):
    """rot(x) for a `_load_rotary` tile of interleaved pairs: columns (2j, 2j + 1) become
    (-x[2j + 1], x[2j]). The pair transform is then y = x * cos + rot(x) * sin, cos and sin
    (1, 2 * BLOCK_P) per column; for the transpose, column 2j's sine is -sin[2j + 1] and column
    2j + 1's is -sin[2j] (each member takes its partner's, negated: the backward above).

    split / join exist from Triton 3.0. They are spelled triton.language.* because Triton 2.2
    resolves every tl.<name> of a kernel's call tree when it hashes the kernel, even in
    branches it never compiles; it skips names under `triton.`.
    """
    even, odd = triton.language.split(tl.reshape(x, [BLOCK_R, BLOCK_P, 2]))
    return tl.reshape(triton.language.join(-odd, even), [BLOCK_R, 2 * BLOCK_P])
