"""Attention of a few new queries against a KV cache, split over the cache (flash-decoding).

One program per (split, batch, key/value head, block of query rows). Its rows are the queries
of every query head that shares the key/value head: row r is query r % S_q of head
kv_head * GROUP + r // S_q, so each K/V tile is loaded once for the whole group (GQA/MQA) and the
[rows, keys] scores are one tensor-core product even for a single new token (rows are padded to
16, the smallest dot shape).

Key positions: the cache holds cache_len = cache_seqlens[b] keys of row b; with new keys
(HAS_NEW) the S_q rows of k_new/v_new follow at positions cache_len ... cache_len + S_q - 1, so
the keys number seqlen_k = cache_len + S_q (else cache_len). Query i sits at position
seqlen_k - S_q + i (bottom-right, as the training kernels) and sees key j when
-window_left <= j - position <= window_right (causal: window_right = 0).

Splits: the cache keys some row can see, [lo, hi), are cut into N_SPLITS chunks of whole BLOCK_N
blocks per batch row (its own length decides the chunk, so short rows do not idle beside long
ones). Each split writes its fp32 partial output, normalized, and its natural-log LSE; the
combine kernel weighs the splits by exp(lse_s - max lse). With one split the program writes the
output directly. The new keys are read from k_new/v_new by the last split (no program reads the
cache rows they go to) and written into the cache by its first row block: one launch appends
and attends. Within a split, the blocks every row sees whole (inside the band and below the
length) take no mask; the band's edges and the length's tail do.

Rotary embedding (ROTARY_DIM > 0, with new keys): the queries and the new keys are rotated
rotate-half over their first ROTARY_DIM columns at their positions (query i and new key i at
cache_len + i), in fp32 and rounded once, as they are loaded; the rotated keys are what the
cache receives. The tables are read at rows below capacity only.

Memory safety whatever cache_seqlens holds: a length is clamped into [0, capacity - S_new], so no
program reads or writes outside the cache (the row's output is then that of the clamped length).
"""

import triton
import triton.language as tl

from .common import LN2, LOG2E, _dot, _dot_acc, _to_dtype


@triton.jit
def _rotary(x, ptrs, offs_d, pos, rows_mask, cos_ptr, sin_ptr, stride_cos, stride_sin, ROTARY_DIM: tl.constexpr,
            UPCAST: tl.constexpr):  # fmt: skip
    """x, the tile loaded from ptrs (rows x offs_d), rotated rotate-half over its first ROTARY_DIM
    columns at positions pos (rows): x * cos + rotate_half(x) * sin in fp32, rounded once."""
    HALF: tl.constexpr = ROTARY_DIM // 2
    partner = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
    mask = rows_mask[:, None] & (offs_d < ROTARY_DIM)[None, :]
    x_pair = tl.load(ptrs + (partner - offs_d)[None, :], mask=mask, other=0.0).to(tl.float32)
    pos64 = pos.to(tl.int64)[:, None]
    cos = tl.load(cos_ptr + pos64 * stride_cos + offs_d[None, :], mask=mask, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos64 * stride_sin + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    sign = tl.where(offs_d < HALF, -1.0, 1.0)
    return _to_dtype(x.to(tl.float32) * cos + sign[None, :] * x_pair * sin, x.dtype, UPCAST)


@triton.jit
def _decode_update(
    acc, l_i, m_i, q, k, v, q_pos, keys, key_end, qk_scale, slope2, window_left, window_right,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """One key block of the online softmax (log2 domain): the updated (acc, l_i, m_i)."""
    s = _dot(q, tl.trans(k), UPCAST) * qk_scale
    if ALIBI:
        s -= slope2[:, None] * tl.abs(keys[None, :].to(tl.float32) - q_pos[:, None].to(tl.float32))
    if MASKED:
        rel = keys[None, :] - q_pos[:, None]
        visible = keys[None, :] < key_end
        if HAS_RIGHT:
            visible = visible & (rel <= window_right)
        if HAS_LEFT:
            visible = visible & (rel >= -window_left)
        s = tl.where(visible, s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        # A row that has seen no visible key yet keeps m = -inf: shift by 0, not by -inf.
        m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
    else:
        m_shift = m_new
    p = tl.math.exp2(s - m_shift[:, None])
    alpha = tl.math.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _dot_acc(_to_dtype(p, v.dtype, UPCAST), v, acc * alpha[:, None], UPCAST)
    return acc, l_i, m_new


@triton.jit
def _decode_blocks(
    acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, lo, hi, key_end, q_pos, qk_scale, slope2,
    window_left, window_right,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Cache rows (key positions) [lo, hi) of k_base/v_base in blocks of BLOCK_N; MASKED blocks load
    and see only keys < key_end inside each query's band."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    for start in range(lo, hi, BLOCK_N):
        keys = start + offs_n
        k_ptrs = k_base + keys.to(tl.int64)[:, None] * stride_ks + offs_d[None, :]
        v_ptrs = v_base + keys.to(tl.int64)[:, None] * stride_vs + offs_d[None, :]
        if MASKED:
            mask = (keys[:, None] < key_end) & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(k_ptrs, mask=mask, other=0.0)
            v = tl.load(v_ptrs, mask=mask, other=0.0)
        elif BLOCK_D != HEAD_DIM:
            k = tl.load(k_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
            v = tl.load(v_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        acc, l_i, m_i = _decode_update(
            acc, l_i, m_i, q, k, v, q_pos, keys, key_end, qk_scale, slope2, window_left, window_right, MASKED,
            HAS_LEFT, HAS_RIGHT, ALIBI, UPCAST,
        )  # fmt: skip
    return acc, l_i, m_i


@triton.jit
def _new_keys_block(
    acc, l_i, m_i, start, q, kn_base, vn_base, stride_kns, stride_vns, n_new, cache_len, q_pos, qk_scale, slope2,
    window_left, window_right, cos_ptr, sin_ptr, stride_cos, stride_sin,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr, ROTARY_DIM: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Rows [start, start + BLOCK_N) of k_new/v_new, at key positions cache_len + row (rotated when
    ROTARY_DIM > 0), into the online softmax."""
    offs_d = tl.arange(0, BLOCK_D)
    rows = start + tl.arange(0, BLOCK_N)
    keys = rows + cache_len
    mask = (rows[:, None] < n_new) & (offs_d[None, :] < HEAD_DIM)
    k_ptrs = kn_base + rows.to(tl.int64)[:, None] * stride_kns + offs_d[None, :]
    k = tl.load(k_ptrs, mask=mask, other=0.0)
    v = tl.load(vn_base + rows.to(tl.int64)[:, None] * stride_vns + offs_d[None, :], mask=mask, other=0.0)
    if ROTARY_DIM > 0:
        k = _rotary(k, k_ptrs, offs_d, keys, rows < n_new, cos_ptr, sin_ptr, stride_cos, stride_sin, ROTARY_DIM, UPCAST)
    return _decode_update(
        acc, l_i, m_i, q, k, v, q_pos, keys, cache_len + n_new, qk_scale, slope2, window_left, window_right, True,
        HAS_LEFT, HAS_RIGHT, ALIBI, UPCAST,
    )  # fmt: skip


@triton.jit
def _decode_new_keys(
    acc, l_i, m_i, q, kn_base, vn_base, stride_kns, stride_vns, n_new, cache_len, q_pos, qk_scale, slope2,
    window_left, window_right, cos_ptr, sin_ptr, stride_cos, stride_sin,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr, ROTARY_DIM: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """The n_new rows of k_new/v_new in blocks of BLOCK_N. With rotary, a while loop, which Triton
    does not software-pipeline: pipelined, the tables' tiles were buffered per stage (212 KB of
    shared memory on sm_90, 2.7x the kernel's time at a 512-key cache) for a loop that runs once
    per decode step."""
    if ROTARY_DIM > 0:
        start = n_new * 0
        while start < n_new:
            acc, l_i, m_i = _new_keys_block(
                acc, l_i, m_i, start, q, kn_base, vn_base, stride_kns, stride_vns, n_new, cache_len, q_pos, qk_scale,
                slope2, window_left, window_right, cos_ptr, sin_ptr, stride_cos, stride_sin, HEAD_DIM, BLOCK_D,
                BLOCK_N, HAS_LEFT, HAS_RIGHT, ALIBI, ROTARY_DIM, UPCAST,
            )  # fmt: skip
            start += BLOCK_N
    else:
        for start in range(0, n_new, BLOCK_N):
            acc, l_i, m_i = _new_keys_block(
                acc, l_i, m_i, start, q, kn_base, vn_base, stride_kns, stride_vns, n_new, cache_len, q_pos, qk_scale,
                slope2, window_left, window_right, cos_ptr, sin_ptr, stride_cos, stride_sin, HEAD_DIM, BLOCK_D,
                BLOCK_N, HAS_LEFT, HAS_RIGHT, ALIBI, ROTARY_DIM, UPCAST,
            )  # fmt: skip
    return acc, l_i, m_i


@triton.jit
def _append_block(
    start, src_base, dst_base, stride_src, stride_dst, n_rows, first_pos, cos_ptr, sin_ptr, stride_cos, stride_sin,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, ROTARY_DIM: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """Copy rows [start, start + BLOCK_N) of one head from src_base to dst_base (rotated at positions
    first_pos + row when ROTARY_DIM > 0)."""
    offs_d = tl.arange(0, BLOCK_D)
    rows = (start + tl.arange(0, BLOCK_N)).to(tl.int64)
    mask = (rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM)
    src_ptrs = src_base + rows[:, None] * stride_src + offs_d[None, :]
    tile = tl.load(src_ptrs, mask=mask)
    if ROTARY_DIM > 0:
        tile = _rotary(tile, src_ptrs, offs_d, first_pos + rows, rows < n_rows, cos_ptr, sin_ptr, stride_cos,
                       stride_sin, ROTARY_DIM, UPCAST)  # fmt: skip
    tl.store(dst_base + rows[:, None] * stride_dst + offs_d[None, :], tile, mask=mask)


@triton.jit
def _append_rows(
    src_base, dst_base, stride_src, stride_dst, n_rows, first_pos, cos_ptr, sin_ptr, stride_cos, stride_sin,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, ROTARY_DIM: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """Copy rows [0, n_rows) of one head from src_base to dst_base; with rotary (rotated at positions
    first_pos + row) in a while loop, as in _decode_new_keys."""
    if ROTARY_DIM > 0:
        start = n_rows * 0
        while start < n_rows:
            _append_block(start, src_base, dst_base, stride_src, stride_dst, n_rows, first_pos, cos_ptr, sin_ptr,
                          stride_cos, stride_sin, HEAD_DIM, BLOCK_D, BLOCK_N, ROTARY_DIM, UPCAST)  # fmt: skip
            start += BLOCK_N
    else:
        for start in range(0, n_rows, BLOCK_N):
            _append_block(start, src_base, dst_base, stride_src, stride_dst, n_rows, first_pos, cos_ptr, sin_ptr,
                          stride_cos, stride_sin, HEAD_DIM, BLOCK_D, BLOCK_N, ROTARY_DIM, UPCAST)  # fmt: skip


@triton.jit(do_not_specialize=["n_kv_heads", "seqlen_q", "capacity", "window_left", "window_right"])
def _decode_split_kernel(
    # pointers (k_new/v_new unused without HAS_NEW, slopes without ALIBI, the rotary tables without
    # ROTARY_DIM, the partials with one split)
    q_ptr, k_cache_ptr, v_cache_ptr, cache_seqlens_ptr, k_new_ptr, v_new_ptr, slopes_ptr, cos_ptr, sin_ptr, out_ptr,
    o_part_ptr, lse_part_ptr,
    # strides (batch, position, head); the head dim has unit stride
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_knb, stride_kns, stride_knh,
    stride_vnb, stride_vns, stride_vnh,
    stride_ob, stride_os, stride_oh,
    stride_slope_b, stride_slope_h,
    stride_cos, stride_sin,
    # sizes and options
    n_heads, n_kv_heads, seqlen_q, capacity, softmax_scale, window_left, window_right,
    # meta-parameters
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, N_SPLITS: tl.constexpr, HAS_NEW: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr, ROTARY_DIM: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    split = tl.program_id(0)
    batch_kv = tl.program_id(1)
    pid_m = tl.program_id(2)
    batch = batch_kv // n_kv_heads
    kv_head = batch_kv % n_kv_heads
    batch64 = batch.to(tl.int64)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = rows < GROUP * seqlen_q
    query = rows % seqlen_q
    head = kv_head * GROUP + rows // seqlen_q

    if HAS_NEW:
        n_new = seqlen_q
    else:
        n_new = seqlen_q * 0
    cache_len = tl.load(cache_seqlens_ptr + batch)
    cache_len = tl.minimum(tl.maximum(cache_len, 0), capacity - n_new)
    seqlen_k = cache_len + n_new
    q_pos = seqlen_k - seqlen_q + query
    first = seqlen_k - seqlen_q  # the first and last query positions of any row block
    last = seqlen_k - 1

    # Keys some query sees ([lo, hi)) and keys every query sees ([full_lo, full_hi)).
    lo = cache_len * 0
    full_lo = lo
    hi = seqlen_k
    full_hi = seqlen_k
    if HAS_LEFT:
        lo = tl.maximum(first - window_left, 0)
        full_lo = tl.maximum(last - window_left, 0)
    if HAS_RIGHT:
        hi = tl.minimum(last + window_right + 1, seqlen_k)
        full_hi = tl.minimum(first + window_right + 1, seqlen_k)
    hi_cache = tl.minimum(hi, cache_len)
    full_hi = tl.maximum(tl.minimum(full_hi, cache_len), 0)

    # This split's whole blocks of the cache part: [start, end), multiples of BLOCK_N but the tail.
    lo_block = (lo // BLOCK_N) * BLOCK_N
    span = tl.maximum(hi_cache - lo_block, 0)
    chunk = tl.cdiv(tl.cdiv(span, N_SPLITS), BLOCK_N) * BLOCK_N
    start = lo_block + split * chunk
    end = tl.maximum(tl.minimum(start + chunk, hi_cache), start)
    full_start = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK_N) * BLOCK_N, start), end)
    full_end = tl.maximum(tl.minimum((full_hi // BLOCK_N) * BLOCK_N, end), full_start)

    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    q_ptrs = (
        q_ptr + batch64 * stride_qb + query.to(tl.int64)[:, None] * stride_qs + head.to(tl.int64)[:, None] * stride_qh
        + offs_d[None, :]
    )  # fmt: skip
    q = tl.load(q_ptrs, mask=row_valid[:, None] & d_valid[None, :], other=0.0)
    if ROTARY_DIM > 0:
        q = _rotary(q, q_ptrs, offs_d, q_pos, row_valid, cos_ptr, sin_ptr, stride_cos, stride_sin, ROTARY_DIM, UPCAST)
    qk_scale = softmax_scale * LOG2E
    if ALIBI:
        slopes = tl.load(slopes_ptr + batch64 * stride_slope_b + head * stride_slope_h, mask=row_valid, other=0.0)
        slope2 = slopes.to(tl.float32) * LOG2E
    else:
        slope2 = tl.zeros([BLOCK_M], dtype=tl.float32)

    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    k_base = k_cache_ptr + batch64 * stride_kb + kv_head.to(tl.int64) * stride_kh
    v_base = v_cache_ptr + batch64 * stride_vb + kv_head.to(tl.int64) * stride_vh
    acc, l_i, m_i = _decode_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, start, full_start, hi_cache, q_pos, qk_scale, slope2,
        window_left, window_right, HEAD_DIM, BLOCK_D, BLOCK_N, True, HAS_LEFT, HAS_RIGHT, ALIBI, UPCAST,
    )  # fmt: skip
    acc, l_i, m_i = _decode_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, full_start, full_end, hi_cache, q_pos, qk_scale,
        slope2, window_left, window_right, HEAD_DIM, BLOCK_D, BLOCK_N, False, HAS_LEFT, HAS_RIGHT, ALIBI, UPCAST,
    )  # fmt: skip
    acc, l_i, m_i = _decode_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, full_end, end, hi_cache, q_pos, qk_scale, slope2,
        window_left, window_right, HEAD_DIM, BLOCK_D, BLOCK_N, True, HAS_LEFT, HAS_RIGHT, ALIBI, UPCAST,
    )  # fmt: skip
    if HAS_NEW:
        if split == N_SPLITS - 1:
            kn_base = k_new_ptr + batch64 * stride_knb + kv_head.to(tl.int64) * stride_knh
            vn_base = v_new_ptr + batch64 * stride_vnb + kv_head.to(tl.int64) * stride_vnh
            acc, l_i, m_i = _decode_new_keys(
                acc, l_i, m_i, q, kn_base, vn_base, stride_kns, stride_vns, seqlen_q, cache_len, q_pos, qk_scale,
                slope2, window_left, window_right, cos_ptr, sin_ptr, stride_cos, stride_sin, HEAD_DIM, BLOCK_D,
                BLOCK_N, HAS_LEFT, HAS_RIGHT, ALIBI, ROTARY_DIM, UPCAST,
            )  # fmt: skip
            if pid_m == 0:
                row0 = cache_len.to(tl.int64)
                _append_rows(kn_base, k_base + row0 * stride_ks, stride_kns, stride_ks, seqlen_q, cache_len, cos_ptr,
                             sin_ptr, stride_cos, stride_sin, HEAD_DIM, BLOCK_D, BLOCK_N, ROTARY_DIM,
                             UPCAST)  # fmt: skip
                _append_rows(vn_base, v_base + row0 * stride_vs, stride_vns, stride_vs, seqlen_q, cache_len, cos_ptr,
                             sin_ptr, stride_cos, stride_sin, HEAD_DIM, BLOCK_D, BLOCK_N, 0, UPCAST)  # fmt: skip

    # A row that saw no key has l = 0: output 0, LSE -inf.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc * (1.0 / l_safe)[:, None]
    store_mask = row_valid[:, None] & d_valid[None, :]
    if N_SPLITS == 1:
        out_ptrs = (
            out_ptr + batch64 * stride_ob + query.to(tl.int64)[:, None] * stride_os
            + head.to(tl.int64)[:, None] * stride_oh + offs_d[None, :]
        )  # fmt: skip
        tl.store(out_ptrs, _to_dtype(o, out_ptr.dtype.element_ty, UPCAST), mask=store_mask)
    else:
        part_row = ((batch64 * n_heads + head) * seqlen_q + query) * N_SPLITS + split  # (rows, splits) of the partials
        tl.store(o_part_ptr + part_row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=store_mask)
        lse = tl.where(l_i == 0.0, -float("inf"), (m_i + tl.math.log2(l_safe)) * LN2)
        tl.store(lse_part_ptr + part_row, lse, mask=row_valid)


@triton.jit(do_not_specialize=["n_heads", "seqlen_q"])
def _decode_combine_kernel(
    o_part_ptr, lse_part_ptr, out_ptr,
    stride_ob, stride_os, stride_oh,
    n_heads, seqlen_q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, N_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """One output row (batch, query, head): the splits' partial outputs weighed by exp(lse_s - max)."""
    row = tl.program_id(0).to(tl.int64)  # (batch * n_heads + head) * seqlen_q + query
    query = row % seqlen_q
    head = (row // seqlen_q) % n_heads
    batch = row // (seqlen_q * n_heads)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    lse = tl.load(lse_part_ptr + row * N_SPLITS + offs_s, mask=offs_s < N_SPLITS, other=-float("inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == -float("inf"), 0.0, m)
    weight = tl.math.exp2((lse - m) * LOG2E)  # 0 for an empty split
    total = tl.sum(weight, 0)
    mask = (offs_s[:, None] < N_SPLITS) & (offs_d[None, :] < HEAD_DIM)
    parts = tl.load(o_part_ptr + (row * N_SPLITS + offs_s[:, None]) * HEAD_DIM + offs_d[None, :], mask=mask, other=0.0)
    o = tl.sum(parts * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    out_ptrs = out_ptr + batch * stride_ob + query * stride_os + head * stride_oh + offs_d
    tl.store(out_ptrs, _to_dtype(o, out_ptr.dtype.element_ty, UPCAST), mask=offs_d < HEAD_DIM)
