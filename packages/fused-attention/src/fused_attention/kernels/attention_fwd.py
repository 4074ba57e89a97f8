"""Flash attention forward (FlashAttention-2): one program per (query block, batch, head).

Scope: fp16/bf16 inputs, head dims up to 256 (the tile is padded to a power of two and masked),
any sequence lengths (ragged tails masked), dense (B, S, H, D) or packed varlen batches, GQA/MQA,
causal and sliding-window masks aligned bottom-right, ALiBi, softcapped scores, dropout. Outputs
O in the input dtype and the natural-log LSE in fp32 (-inf, with O = 0, for a query that sees no
key).

Algorithm: the query tile stays in registers while key/value tiles stream through an online
softmax in the exp2 domain; no S x S matrix exists. The key loop is split in three ranges:
boundary blocks below the band, fully visible blocks, boundary blocks above it (the causal
diagonal, the window edge, the ragged key tail). Only boundary blocks build a mask; the fully
visible ones also take the FMA form of the softmax update, and on Hopper with TMA they load K/V
through tensor descriptors (TMA copies into multi-buffered shared memory).
Programs walk query blocks last-first, so the longest causal rows start first.

Sizes, options and the LSE/slope strides are not specialized by the JIT (`do_not_specialize`):
they change from call to call without changing the code worth generating.

Trade-offs: head dims that are not powers of two (80, 96, 160, 192) pay for the padded lanes in
both matmuls; rows of a query block that fall past the sequence end are computed and discarded.
"""

import triton
import triton.language as tl

from .common import (
    LN2,
    LOG2E,
    _alibi_far_split,
    _alibi_slope2,
    _alibi_tile,
    _band_blocks,
    _band_mask,
    _dot,
    _dot_acc,
    _dropout_keep,
    _load_rows,
    _load_tile,
    _program_block,
    _rng_words,
    _scores,
    _seq_bounds,
    _store_tile,
    _to_dtype,
)


@triton.jit
def _fwd_update(
    acc, l_i, m_i, q, k, v, offs_m, offs_n, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in,
    softcap_out, slope2, key_bias, row_bias, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr,
    ALIBI_FAR: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One key block of the online softmax: returns the updated (acc, l_i, m_i). ALIBI_FAR: a fully
    visible block far off the diagonal, its bias the rank-1 key_bias[c] + row_bias[r] (common.py)."""
    qk = _dot(q, tl.trans(k), UPCAST)
    if ALIBI_FAR:
        # The per-key bias rides in the scale's FMA; the per-query one shifts the row's max only.
        s = _scores(qk, qk_scale, softcap_in, softcap_out, SOFTCAP) + key_bias[None, :]
        m_new = tl.maximum(m_i, tl.max(s, 1) + row_bias)
        p = tl.math.exp2(s - (m_new - row_bias)[:, None])
        alpha = tl.math.exp2(m_i - m_new)
    elif ((not ALIBI) and (not MASKED)) and (not SOFTCAP):  # (Triton 2.2 takes no chained and)
        # Fully visible block, no bias: the row max of the raw scores, then one FMA per score.
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
    else:
        s = _scores(qk, qk_scale, softcap_in, softcap_out, SOFTCAP)
        if ALIBI:
            s += _alibi_tile(offs_m[:, None], offs_n[None, :], diag, slope2)
        if MASKED:
            visible = _band_mask(offs_m[:, None], offs_n[None, :], diag, window_left, window_right, HAS_LEFT, HAS_RIGHT)
            s = tl.where(visible & (offs_n[None, :] < seqlen_k), s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASKED:
            # A row that has seen no visible key yet keeps m = -inf: shift by 0, not by -inf.
            m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        else:
            m_shift = m_new
        p = tl.math.exp2(s - m_shift[:, None])
        alpha = tl.math.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    if DROPOUT:  # the normalizer above counts every key; only kept ones reach O
        keep = _dropout_keep(
            offs_m[:, None], offs_n[None, :], seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold
        )
        p = tl.where(keep, p, 0.0)
    acc = _dot_acc(_to_dtype(p, v.dtype, UPCAST), v, acc * alpha[:, None], UPCAST)
    return acc, l_i, m_new


@triton.jit
def _fwd_blocks(
    acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, desc_batch, desc_row, kv_head, stride_ks, stride_vs,
    offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, lo, hi, far_sign,
    seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr, ALIBI_FAR: tl.constexpr,
    SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr, TMA: tl.constexpr, HEADS_OUTER: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """Key blocks [lo, hi): MASKED ones on the band's edges or past the key tail, the others fully
    visible. TMA: K/V tiles through descriptors (the caller only asks for it where a tile cannot
    cross into another sequence's rows). ALIBI_FAR: every block lies at least BLOCK_N keys below
    (far_sign = 1) or above (far_sign = -1) the diagonal of every query of the tile."""
    offs_n = tl.arange(0, BLOCK_N)
    # -slope * |j - (i + diag)| = far_sign * slope * (c + (start_n - (i + diag))) for key c of the block.
    key_bias = far_sign * slope2 * offs_n.to(tl.float32)
    row_pos = offs_m + diag
    offs_d = tl.arange(0, BLOCK_D)
    k_offs = offs_n[:, None] * stride_ks + offs_d[None, :]
    v_offs = offs_n[:, None] * stride_vs + offs_d[None, :]
    stride_ks64 = stride_ks.to(tl.int64)
    stride_vs64 = stride_vs.to(tl.int64)
    for start_n in range(lo, hi, BLOCK_N):
        k = _load_rows(
            k_base, k_desc, desc_batch, desc_row, kv_head, start_n, offs_n, stride_ks64, k_offs, seqlen_k,
            HEAD_DIM, BLOCK_N, BLOCK_D, MASKED, TMA, HEADS_OUTER,
        )  # fmt: skip
        v = _load_rows(
            v_base, v_desc, desc_batch, desc_row, kv_head, start_n, offs_n, stride_vs64, v_offs, seqlen_k,
            HEAD_DIM, BLOCK_N, BLOCK_D, MASKED, TMA, HEADS_OUTER,
        )  # fmt: skip
        row_bias = far_sign * slope2 * (start_n - row_pos).to(tl.float32)
        acc, l_i, m_i = _fwd_update(
            acc, l_i, m_i, q, k, v, offs_m, start_n + offs_n, seqlen_k, diag, window_left, window_right, qk_scale,
            softcap_in, softcap_out, slope2, key_bias, row_bias, seed_lo, seed_hi, rng_head, rng_offset,
            dropout_threshold, MASKED, HAS_LEFT, HAS_RIGHT, ALIBI, ALIBI_FAR, SOFTCAP, DROPOUT, UPCAST,
        )  # fmt: skip
    return acc, l_i, m_i


@triton.jit(
    do_not_specialize=["n_heads", "kv_group", "max_seqlen_q", "max_seqlen_k", "total_q", "total_k", "window_left",
                       "window_right", "dropout_threshold", "stride_lse_b", "stride_lse_h", "stride_slope_b",
                       "stride_slope_h"]
)  # fmt: skip
def _attn_fwd_kernel(
    # pointers
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, slopes_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, rng_ptr, k_desc, v_desc,
    # strides (batch, position, head); the head dim has unit stride
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lse_b, stride_lse_h,
    stride_slope_b, stride_slope_h,
    # sizes and options (total_q, total_k: the packed tensors' rows, varlen)
    n_heads, kv_group, max_seqlen_q, max_seqlen_k, total_q, total_k, softmax_scale, softcap_in, softcap_out,
    window_left, window_right, dropout_threshold, dropout_scale,
    # meta-parameters
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr, HEADS_OUTER: tl.constexpr, BLOCK_MAJOR: tl.constexpr,
    # the autotuned ones last: Triton 2.2's autotuner indexes its key by position among the passed arguments
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr,
):  # fmt: skip
    num_m_blocks = tl.cdiv(max_seqlen_q, BLOCK_M)
    block, batch_head = _program_block(num_m_blocks, BLOCK_MAJOR)
    # Query blocks last-first: the longest causal rows are scheduled first.
    pid_m = num_m_blocks - 1 - block
    batch = batch_head // n_heads
    head = batch_head % n_heads
    kv_head = head // kv_group
    q_start, seqlen_q = _seq_bounds(cu_seqlens_q_ptr, batch, max_seqlen_q, total_q, IS_VARLEN)
    k_start, seqlen_k = _seq_bounds(cu_seqlens_k_ptr, batch, max_seqlen_k, total_k, IS_VARLEN)
    m0 = pid_m * BLOCK_M
    if IS_VARLEN:
        if m0 >= seqlen_q:
            return
    diag = seqlen_k - seqlen_q

    batch64 = batch.to(tl.int64)
    q_base = q_ptr + batch64 * stride_qb + (q_start + m0).to(tl.int64) * stride_qs + head.to(tl.int64) * stride_qh
    k_base = k_ptr + batch64 * stride_kb + k_start.to(tl.int64) * stride_ks + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + batch64 * stride_vb + k_start.to(tl.int64) * stride_vs + kv_head.to(tl.int64) * stride_vh
    o_base = o_ptr + batch64 * stride_ob + (q_start + m0).to(tl.int64) * stride_os + head.to(tl.int64) * stride_oh
    lse_base = lse_ptr + batch64 * stride_lse_b + head.to(tl.int64) * stride_lse_h + q_start + m0

    offs_r = tl.arange(0, BLOCK_M)
    offs_m = m0 + offs_r
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_tile(
        q_base + offs_r[:, None] * stride_qs + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, True,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    qk_scale = softmax_scale * LOG2E
    slope2 = _alibi_slope2(slopes_ptr, batch, head, stride_slope_b, stride_slope_h, ALIBI)
    seed_lo, seed_hi, rng_head, rng_offset = _rng_words(rng_ptr, batch, n_heads, head, DROPOUT)

    # TMA descriptors see a packed varlen batch as batch 1.
    if IS_VARLEN:
        desc_batch = 0
    else:
        desc_batch = batch
    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    last_m = tl.minimum(m0 + BLOCK_M, seqlen_q) - 1
    start, full_start, full_end, end = _band_blocks(
        m0 + diag, last_m + diag, seqlen_k, window_left, window_right, HAS_LEFT, HAS_RIGHT, BLOCK_N
    )
    if HAS_LEFT:
        acc, l_i, m_i = _fwd_blocks(
            acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks, stride_vs,
            offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, start,
            full_start, 1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, HEAD_DIM, BLOCK_D, BLOCK_N,
            True, HAS_LEFT, HAS_RIGHT, ALIBI, False, SOFTCAP, DROPOUT, USE_TMA and not IS_VARLEN, HEADS_OUTER, UPCAST,
        )  # fmt: skip
    # ALiBi in dense batches: the fully visible blocks far off the diagonal take the rank-1 bias
    # (common.py). With a right bound the near blocks join the masked loop of the diagonal (which
    # keeps the loop count), and that loop runs first: ptxas serializes every wgmma of the kernel
    # (C7515) when a loop that may be skipped comes first with loop-invariant work in its
    # preheader (the key bias vector), as the skip path then re-defines the zeroed accumulator.
    # Without one the near blocks' loop comes first. Varlen batches keep the exact form: their
    # masked loops load without TMA, and ptxas serialized the far loop after them.
    masked_start = full_end
    if ALIBI and not IS_VARLEN:
        below_end, above_start = _alibi_far_split(m0 + diag, last_m + diag, full_start, full_end, BLOCK_N, BLOCK_N)
        if HAS_RIGHT:
            masked_start = below_end
    if (ALIBI and HAS_RIGHT) and not IS_VARLEN:
        acc, l_i, m_i = _fwd_blocks(
            acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks, stride_vs,
            offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, masked_start,
            end, 1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, HEAD_DIM, BLOCK_D, BLOCK_N, True,
            HAS_LEFT, HAS_RIGHT, ALIBI, False, SOFTCAP, DROPOUT, USE_TMA, HEADS_OUTER, UPCAST,
        )  # fmt: skip
    if ALIBI and not IS_VARLEN:
        if not HAS_RIGHT:
            acc, l_i, m_i = _fwd_blocks(
                acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks, stride_vs,
                offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, below_end,
                above_start, 1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, HEAD_DIM, BLOCK_D, BLOCK_N,
                False, HAS_LEFT, HAS_RIGHT, ALIBI, False, SOFTCAP, DROPOUT, USE_TMA, HEADS_OUTER, UPCAST,
            )  # fmt: skip
        acc, l_i, m_i = _fwd_blocks(
            acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks, stride_vs,
            offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, full_start,
            below_end, 1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, HEAD_DIM, BLOCK_D, BLOCK_N,
            False, HAS_LEFT, HAS_RIGHT, ALIBI, True, SOFTCAP, DROPOUT, USE_TMA, HEADS_OUTER, UPCAST,
        )  # fmt: skip
        if not HAS_RIGHT:
            acc, l_i, m_i = _fwd_blocks(
                acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks, stride_vs,
                offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2,
                above_start, full_end, -1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, HEAD_DIM,
                BLOCK_D, BLOCK_N, False, HAS_LEFT, HAS_RIGHT, ALIBI, True, SOFTCAP, DROPOUT, USE_TMA, HEADS_OUTER,
                UPCAST,
            )  # fmt: skip
    else:
        acc, l_i, m_i = _fwd_blocks(
            acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks, stride_vs,
            offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, full_start,
            full_end, 1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, HEAD_DIM, BLOCK_D, BLOCK_N, False,
            HAS_LEFT, HAS_RIGHT, ALIBI, False, SOFTCAP, DROPOUT, USE_TMA, HEADS_OUTER, UPCAST,
        )  # fmt: skip
    if not ((ALIBI and HAS_RIGHT) and not IS_VARLEN):
        acc, l_i, m_i = _fwd_blocks(
            acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks, stride_vs,
            offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, masked_start,
            end, 1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, HEAD_DIM, BLOCK_D, BLOCK_N, True,
            HAS_LEFT, HAS_RIGHT, ALIBI, False, SOFTCAP, DROPOUT, USE_TMA and not IS_VARLEN, HEADS_OUTER, UPCAST,
        )  # fmt: skip

    # Epilogue: a row with no visible key has l = 0: O = 0 and LSE = -inf.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc * (1.0 / l_safe)[:, None]
    if DROPOUT:
        o *= dropout_scale
    lse2 = m_i + tl.math.log2(l_safe)
    _store_tile(
        o_base + offs_r[:, None] * stride_os + offs_d[None, :], _to_dtype(o, o_ptr.dtype.element_ty, UPCAST), offs_m,
        seqlen_q,
        offs_d, HEAD_DIM, BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    tl.store(lse_base + offs_r, lse2 * LN2, mask=offs_m < seqlen_q)
