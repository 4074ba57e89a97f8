"""@triton.jit helpers shared by the attention forward and backward kernels.

Conventions (all kernels):
- Sequences are addressed as (batch, position, head, dim) through strides; the head dim has unit
  stride. Varlen batches pass cu_seqlens and a batch stride of 0: a sequence starts at row
  cu_seqlens[b] of the packed (total, heads, dim) tensor, and every access stays within rows
  [0, total) whatever the offsets hold (`_seq_bounds` empties a sequence outside them).
  Offsets of a tile's rows within a block are int32 (the launchers copy an input whose position
  stride could overflow them); the batch, head and block-start offsets are int64.
- Query i of a sequence is aligned with key i + diag, diag = seqlen_k - seqlen_q (bottom-right,
  as FlashAttention-2). Key j is visible to query i when
  -window_left <= j - (i + diag) <= window_right; a bound is absent unless HAS_LEFT / HAS_RIGHT
  (causal is window_right = 0).
- Scores live in the log2 domain: s2 = (q.k) * softmax_scale * log2(e) + bias * log2(e), so the
  softmax uses exp2. The saved LSE is natural-log, fp32: lse = ln(sum_j exp(s_j)).
- Softcap (SOFTCAP, Gemma-2): the scaled product is capped before any bias or mask,
  softcap * tanh(q.k * softmax_scale / softcap); the backward multiplies dS by the cap's
  derivative, 1 - tanh^2, recomputed with the scores.
- Dropout (DROPOUT): a probability P_ij is kept (scaled by 1 / (1 - p) once, on O or in the
  backward's products) or dropped by a Philox draw of (seed, query head, i, j); the softmax's
  normalizer and the LSE stay those of the undropped P. The backward's delta = rowsum(dO * O) is
  then rowsum(P * dP) with dP = Z * (dO V^T) / (1 - p), as dS = P * (dP - delta) needs.
- ALiBi (bias = -slope * |i + diag - j|, ALIBI a 0/1 flag): near the diagonal the distance is
  formed in fp32 from the exact float positions (j - (i + diag), integers below 2^24: exact),
  then scaled once, so a score near the diagonal carries only its own rounding, as PyTorch's fp32
  scores do. Converting positions per vector and subtracting per element avoids an int -> float
  conversion per element. That costs three fp32 operations per score on top of the plain ones.
  In the forward and dQ kernels (dense batches), key blocks at least BLOCK_N keys off the diagonal
  for every query of the tile (`_alibi_far_split`) take a rank-1 form instead, one operation per
  score: on one side of the diagonal the bias is sign * slope * (c + (j0 - i - diag)) for key c of
  a block starting at j0, a per-key vector added in the FMA of the scale and a per-query term
  folded into the row's max (forward) or its LSE (dQ). Its roundings are at the magnitude of
  slope * (d + 2 * BLOCK_N) for a distance d >= BLOCK_N, within 3x of the bias itself, and such a
  score weighs at most 2^(-slope * log2(e) * d) of the diagonal's in the softmax: the error it
  brings stays far below an fp32 ulp of the LSE (the GPU tests check the LSE with slopes up to
  1.05). (Using the rank-1 form on the diagonal blocks too put every score there at
  slope * BLOCK_N in magnitude: with 128-query blocks and slopes near 1 the fp32 LSE was off by
  about 1e-5.) The dK/dV kernel keeps the exact form everywhere (its D = 128 configs already
  spill; the vectors cost 12 %), and so do varlen batches (ptxas serialized their far loop).
"""

import triton
import triton.language as tl

from .._runtime.dropout import load_rng_words, philox_keep

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    """a @ b in fp32 (tensor cores for fp16/bf16); fp32 operands when interpreting (UPCAST)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b)


@triton.jit
def _dot_acc(a, b, acc, UPCAST: tl.constexpr):
    """acc + a @ b, accumulated in fp32."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _to_dtype(x, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """fp32 `x` in `dtype`, rounded to nearest even.

    The interpreter (UPCAST) truncates fp32 -> bf16 casts; there the rounding is done on the bits
    first (add half an ulp, ties to even, drop the low 16 bits), so that the P and dS operands of
    the matmuls carry no systematic bias into the sums they feed.
    """
    if UPCAST:
        if dtype == tl.bfloat16:
            bits = x.to(tl.int32, bitcast=True)
            bits += 0x7FFF + ((bits >> 16) & 1)
            x = (bits & -65536).to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _program_block(n_blocks, BLOCK_MAJOR: tl.constexpr):
    """(block, batch-head) of this program in a 1-D grid of n_blocks x batch-heads. Head-major:
    the blocks of one batch-head run side by side (sharing its tiles in L2). BLOCK_MAJOR: groups
    of 8 batch-heads one after another, block by block within a group, so under a causal mask the
    longest programs of 8 heads start together and the short ones fill the tail."""
    pid = tl.program_id(0)
    if BLOCK_MAJOR:
        n_batch_heads = tl.num_programs(0) // n_blocks
        group = pid // (8 * n_blocks)
        size = tl.minimum(8, n_batch_heads - group * 8)  # the last group may be smaller
        rest = pid - group * 8 * n_blocks
        return rest // size, group * 8 + rest % size
    else:
        return pid % n_blocks, pid // n_blocks


@triton.jit
def _seq_bounds(cu_seqlens_ptr, batch, seqlen, total, IS_VARLEN: tl.constexpr):
    """(first packed row, length) of sequence `batch`: from cu_seqlens when varlen, else (0, seqlen).

    Varlen: a sequence that does not lie within the `total` rows of the packed tensor (a negative
    start, an end before its start or past the rows; unchecked offsets can hold anything) gets
    length 0, so that no program addresses a row outside the tensor (an empty sequence's start is
    never dereferenced). Zeroing the length, rather than clamping start and end, leaves the
    compiled loops as they were without the check (sm_90, Triton 3.6: clamping reordered them,
    and the D = 64 varlen forward ran 7 % slower).
    """
    if IS_VARLEN:
        start = tl.load(cu_seqlens_ptr + batch)
        length = tl.load(cu_seqlens_ptr + batch + 1) - start
        # int32 differences wrap; with start >= 0 no wrapped value passes the last test.
        length = tl.where((start >= 0) & (length >= 0) & (length <= total - start), length, 0)
    else:
        start = batch * 0
        length = seqlen
    return start, length


@triton.jit
def _load_tile(ptrs, rows, n_rows, cols, n_cols, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """A [rows, cols] tile; masked lanes read 0. Full tiles load without predicates."""
    if MASK_ROWS:
        if MASK_COLS:
            tile = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
        else:
            tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    else:
        if MASK_COLS:
            tile = tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


@triton.jit
def _load_rows(
    base, desc, desc_batch, desc_row, head, start, offs_rows, stride_rows64, tile_offs, n_rows,
    HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr,
    HEADS_OUTER: tl.constexpr,
):  # fmt: skip
    """Positions [start, start + BLOCK_ROWS) of one head as a [BLOCK_ROWS, BLOCK_D] tile.

    TMA: a copy through the 4-D descriptor `desc`, zero-filled past the tensor's bounds; its dims
    follow the memory order: (batch, position, head, dim), or (batch, head, position, dim) when
    HEADS_OUTER. Otherwise pointer loads from `base` (the head's first position), masked past
    n_rows when MASKED and past HEAD_DIM when the dim is padded.
    """
    if TMA:
        if HEADS_OUTER:
            tile = desc.load([desc_batch, head, desc_row + start, 0]).reshape([BLOCK_ROWS, BLOCK_D])
        else:
            tile = desc.load([desc_batch, desc_row + start, head, 0]).reshape([BLOCK_ROWS, BLOCK_D])
    else:
        tile = _load_tile(
            base + start * stride_rows64 + tile_offs, start + offs_rows, n_rows, tl.arange(0, BLOCK_D), HEAD_DIM,
            MASKED, BLOCK_D != HEAD_DIM,
        )  # fmt: skip
    return tile


@triton.jit
def _store_tile(ptrs, value, rows, n_rows, cols, n_cols, MASK_COLS: tl.constexpr):
    if MASK_COLS:
        tl.store(ptrs, value, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))
    else:
        tl.store(ptrs, value, mask=rows[:, None] < n_rows)


@triton.jit
def _band_blocks(
    first, last, length, below, above, HAS_BELOW: tl.constexpr, HAS_ABOVE: tl.constexpr, BLOCK: tl.constexpr
):
    """Blocks of BLOCK indices t in [0, length) that lie in the band [c - below, c + above] of some
    center c in [first, last], as (start, full_start, full_end, end), multiples of BLOCK:
    [start, end) holds every such t; [full_start, full_end) holds the blocks whose every t < length
    lies in the band of every center, which need no masking. An empty band gives start == end.
    """
    lo = first * 0
    full_lo = lo
    hi = lo + length
    full_hi = hi
    if HAS_BELOW:
        lo = tl.maximum(first - below, 0)
        full_lo = tl.maximum(last - below, 0)
    if HAS_ABOVE:
        hi = tl.minimum(last + above + 1, length)
        full_hi = tl.minimum(first + above + 1, length)
    start = (lo // BLOCK) * BLOCK
    end = tl.where(hi > lo, tl.cdiv(hi, BLOCK) * BLOCK, start)
    full_start = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK) * BLOCK, start), end)
    full_end = tl.maximum(tl.minimum((tl.maximum(full_hi, 0) // BLOCK) * BLOCK, end), full_start)
    return start, full_start, full_end, end


@triton.jit
def _band_mask(q_idx, k_idx, diag, window_left, window_right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """True where key k_idx is visible to query q_idx (broadcast shapes); all-True without a bound."""
    rel = k_idx - (q_idx + diag)
    visible = rel == rel
    if HAS_RIGHT:
        visible = visible & (rel <= window_right)
    if HAS_LEFT:
        visible = visible & (rel >= -window_left)
    return visible


@triton.jit
def _alibi_tile(q_idx, k_idx, diag, slope2):
    """-slope * |i + diag - j| in log2 units (slope2 = slope * log2(e)), broadcast over q_idx, k_idx
    (index vectors shaped for the tile): exact distances, one rounding in the product."""
    return -slope2 * tl.abs(k_idx.to(tl.float32) - (q_idx + diag).to(tl.float32))


@triton.jit
def _alibi_far_split(first, last, full_start, full_end, GUARD: tl.constexpr, BLOCK: tl.constexpr):
    """Split the fully visible blocks [full_start, full_end) of BLOCK indices t by their distance
    to the centers [first, last] (as in _band_blocks): returns (below_end, above_start), multiples
    of BLOCK, such that every t of [full_start, below_end) lies at least GUARD below every center
    and every t of [above_start, full_end) at least GUARD above it; the blocks between are near."""
    below_end = (tl.maximum(first - GUARD + 1, 0) // BLOCK) * BLOCK
    below_end = tl.minimum(tl.maximum(below_end, full_start), full_end)
    above_start = tl.cdiv(tl.maximum(last + GUARD, 0), BLOCK) * BLOCK
    above_start = tl.minimum(tl.maximum(above_start, below_end), full_end)
    return below_end, above_start


@triton.jit
def _alibi_slope2(slopes_ptr, batch, head, stride_slope_b, stride_slope_h, ALIBI: tl.constexpr):
    """This (batch, head)'s ALiBi slope times log2(e); 0 without ALiBi."""
    if ALIBI:
        slope2 = tl.load(slopes_ptr + batch * stride_slope_b + head * stride_slope_h).to(tl.float32) * LOG2E
    else:
        slope2 = 0.0
    return slope2


@triton.jit
def _softcap_scores(qk, softcap_in, softcap_out):
    """Softcapped scores of the raw products qk = q.k in log2 units, and the cap's derivative:
    softcap * tanh(qk * softmax_scale / softcap) * log2(e) and 1 - tanh^2, given
    softcap_in = 2 * softmax_scale * log2(e) / softcap and softcap_out = softcap * log2(e).

    tanh comes from one exp2 of -2|x| (at most 1: it never overflows), without a libdevice call;
    1 - tanh^2 = 4e / (1 + e)^2 has no cancellation where the cap saturates.
    """
    e = tl.math.exp2(-tl.abs(qk) * softcap_in)
    r = 1.0 / (1.0 + e)
    t = (1.0 - e) * r
    t = tl.where(qk < 0.0, -t, t)
    return t * softcap_out, 4.0 * e * r * r


@triton.jit
def _scores(qk, qk_scale, softcap_in, softcap_out, SOFTCAP: tl.constexpr):
    """The scores of raw products qk in log2 units: qk * qk_scale, or softcapped (SOFTCAP)."""
    if SOFTCAP:
        s, _ = _softcap_scores(qk, softcap_in, softcap_out)
    else:
        s = qk * qk_scale
    return s


@triton.jit
def _rng_words(rng_ptr, batch, n_heads, head, DROPOUT: tl.constexpr):
    """The dropout's Philox key and per-head counter words, uint32: (seed_lo, seed_hi, rng_head,
    rng_offset) from the key words at rng_ptr (the runtime's dropout_rng); zeros without dropout.
    rng_head = batch * n_heads + head (the query head)."""
    if DROPOUT:
        seed_lo, seed_hi, rng_offset = load_rng_words(rng_ptr)
        rng_head = (batch * n_heads + head).to(tl.uint32)
    else:
        seed_lo = (batch * 0).to(tl.uint32)
        seed_hi = seed_lo
        rng_offset = seed_lo
        rng_head = seed_lo
    return seed_lo, seed_hi, rng_head, rng_offset


@triton.jit
def _dropout_keep(q_idx, k_idx, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold):
    """The dropout's keep mask at queries q_idx x keys k_idx (index tensors that broadcast to the
    tile, positions within the sequence): the runtime's philox_keep at counter (key, query,
    rng_head, rng_offset). Forward and backward regenerate the same mask; nothing is stored."""
    zero = (q_idx + k_idx) * 0
    c0 = (k_idx + zero).to(tl.uint32)
    c1 = (q_idx + zero).to(tl.uint32)
    return philox_keep(c0, c1, c0 * 0 + rng_head, c0 * 0 + rng_offset, seed_lo, seed_hi, dropout_threshold)
