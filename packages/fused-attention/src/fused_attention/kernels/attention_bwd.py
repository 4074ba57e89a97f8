"""Flash attention backward (FlashAttention-2 structure).

1. `_attn_bwd_preprocess_kernel`: delta_i = sum_d dO_id * O_id (minus dLSE_i when the LSE itself
   has a gradient), one program per (query block, batch, head); with ZERO_DQ it also zeroes the
   fp32 dQ accumulator rows of its block (no separate memset launch).
2. `_attn_bwd_dkdv_kernel`: one program per (key block, batch, kv head). K and V stay on chip; the
   program loops over the query heads that share the kv head (GQA/MQA) and, for each, over the
   query blocks that see the key block, recomputing P^T = exp2(S^T - LSE) from the saved LSE:
   dV += P^T dO, dS^T = P^T * (dP^T - delta), dK += dS^T Q. dK and dV are reduced in registers
   and written once. With DQ_ATOMIC the same iteration also forms this key block's share of dQ,
   (dS K)^T = K^T dS^T, and adds it to an fp32 accumulator with relaxed atomics: five matmuls
   per (key block, query block) pair in one kernel, the FlashAttention-2 count, instead of seven
   over two kernels (the dQ kernel recomputes S and dP). On the H100 the seven measured faster at
   every length (ops.configs.DQ_ATOMIC_MIN_SEQLEN): the GPU's default is the dQ kernel. For a full
   (non-causal) range each program starts its query loop at its own key block's offset, so the
   programs of one head that run side by side add into different dQ rows.
3. `_attn_bwd_dq_convert_kernel` (DQ_ATOMIC path): dQ = softmax_scale * accumulator, in q's dtype.
4. `_attn_bwd_dq_kernel` (the default, deterministic path): one program per (query block, batch, head),
   looping over key blocks: dQ += dS K, without atomics (bit-reproducible, two more matmuls).

Both main kernels split their loop like the forward: boundary blocks (band edges, ragged tails)
build a mask, fully visible blocks do not, and on Hopper with TMA they stream their tiles
through tensor descriptors. All products are computed transposed in the dK/dV kernel (S^T, P^T)
so that every matmul has the key block (or the head dim) as its M dimension. Gradients are
accumulated in fp32 and written in the input dtype.

Sizes, options and the LSE strides are not specialized by the JIT (`do_not_specialize`): they
change from call to call without changing the code worth generating, and every specialization
is a compile.
"""

import triton
import triton.language as tl

from .common import (
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
    _seq_bounds,
    _softcap_scores,
    _store_tile,
    _to_dtype,
)

# Arguments the JIT does not specialize (see the module docstring).
_SIZES = [
    "kv_group", "max_seqlen_q", "max_seqlen_k", "total_q", "total_k", "window_left", "window_right",
    "dropout_threshold",
]  # fmt: skip
_SMALL_STRIDES = ["stride_lse_b", "stride_lse_h", "stride_slope_b", "stride_slope_h"]


@triton.jit
def _query_block(cu_seqlens_q_ptr, n_heads, max_seqlen_q, total_q, BLOCK_M: tl.constexpr, IS_VARLEN: tl.constexpr):
    """The query block of a program of a (query block, batch, head) grid: batch and head (int64),
    the first row of its sequence in the tensor (q_start), the sequence's length, and the
    block's first position in the sequence (m0; past the length for empty varlen blocks)."""
    num_m_blocks = tl.cdiv(max_seqlen_q, BLOCK_M)
    pid = tl.program_id(0)
    batch_head = pid // num_m_blocks
    batch = batch_head // n_heads
    q_start, seqlen_q = _seq_bounds(cu_seqlens_q_ptr, batch, max_seqlen_q, total_q, IS_VARLEN)
    m0 = (pid % num_m_blocks) * BLOCK_M
    return batch.to(tl.int64), (batch_head % n_heads).to(tl.int64), q_start, seqlen_q, m0


@triton.jit(
    do_not_specialize=["stride_dlse_b", "stride_dlse_h", "stride_dlse_s", "stride_delta_b", "stride_delta_h",
                       "n_heads", "max_seqlen_q", "total_q"]
)  # fmt: skip
def _attn_bwd_preprocess_kernel(
    # pointers
    o_ptr, do_ptr, dlse_ptr, delta_ptr, dq_accum_ptr, cu_seqlens_q_ptr,
    # strides
    stride_ob, stride_os, stride_oh,
    stride_dob, stride_dos, stride_doh,
    stride_dlse_b, stride_dlse_h, stride_dlse_s,
    stride_delta_b, stride_delta_h,
    stride_dqab, stride_dqah, stride_dqad,
    # sizes (total_q: the packed tensors' rows, varlen)
    n_heads, max_seqlen_q, total_q,
    # meta-parameters
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, IS_VARLEN: tl.constexpr,
    HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr,
):  # fmt: skip
    batch64, head64, q_start, seqlen_q, m0 = _query_block(
        cu_seqlens_q_ptr, n_heads, max_seqlen_q, total_q, BLOCK_M, IS_VARLEN
    )
    if IS_VARLEN:
        if m0 >= seqlen_q:
            return
    row0 = (q_start + m0).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_M)
    offs_m = m0 + offs_r
    offs_d = tl.arange(0, BLOCK_D)
    o_ptrs = o_ptr + batch64 * stride_ob + row0 * stride_os + head64 * stride_oh
    do_ptrs = do_ptr + batch64 * stride_dob + row0 * stride_dos + head64 * stride_doh
    o = _load_tile(
        o_ptrs + offs_r[:, None] * stride_os + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, True,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    do = _load_tile(
        do_ptrs + offs_r[:, None] * stride_dos + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, True,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    if HAS_DLSE:
        dlse_ptrs = dlse_ptr + batch64 * stride_dlse_b + head64 * stride_dlse_h + row0 * stride_dlse_s
        delta -= tl.load(dlse_ptrs + offs_r * stride_dlse_s, mask=offs_m < seqlen_q, other=0.0).to(tl.float32)
    delta_ptrs = delta_ptr + batch64 * stride_delta_b + head64 * stride_delta_h + q_start + offs_m
    tl.store(delta_ptrs, delta, mask=offs_m < seqlen_q)
    if ZERO_DQ:
        dqa_ptrs = dq_accum_ptr + batch64 * stride_dqab + head64 * stride_dqah + row0
        _store_tile(
            dqa_ptrs + offs_d.to(tl.int64)[None, :] * stride_dqad + offs_r[:, None],
            tl.zeros([BLOCK_M, BLOCK_D], tl.float32), offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D != HEAD_DIM,
        )  # fmt: skip


@triton.jit
def _dkdv_update(
    dk, dv, k, v, q, do, lse2, delta, dqa_ptrs, offs_m, offs_n, offs_d, seqlen_q, seqlen_k, diag, window_left,
    window_right, qk_scale, softcap_in, softcap_out, slope2, seed_lo, seed_hi, rng_head, rng_offset,
    dropout_threshold, dropout_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr,
    DQ_ATOMIC: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One query block's contribution to a key block's dK, dV (all tiles transposed: [keys, queries]),
    and with DQ_ATOMIC its share of the query block's dQ, added to the fp32 accumulator."""
    qk_t = _dot(k, tl.trans(q), UPCAST)
    if SOFTCAP:
        s_t, dcap_t = _softcap_scores(qk_t, softcap_in, softcap_out)
    else:
        s_t = qk_t * qk_scale
    if ALIBI:
        s_t += _alibi_tile(offs_m[None, :], offs_n[:, None], diag, slope2)
    p_t = tl.math.exp2(s_t - lse2[None, :])
    if MASKED:
        visible = _band_mask(offs_m[None, :], offs_n[:, None], diag, window_left, window_right, HAS_LEFT, HAS_RIGHT)
        visible = visible & (offs_m[None, :] < seqlen_q)
        if DQ_ATOMIC:
            # Keys past the tail: their dK/dV rows are never stored, but P there is unbounded (the
            # zero K row scores 0) and would reach dQ as inf * 0; the caller masks such blocks.
            visible = visible & (offs_n[:, None] < seqlen_k)
        p_t = tl.where(visible, p_t, 0.0)
    if DROPOUT:  # dV from the kept P; dP of the dropped entries is 0
        keep_t = _dropout_keep(
            offs_m[None, :], offs_n[:, None], seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold
        )
        dv = _dot_acc(_to_dtype(tl.where(keep_t, p_t * dropout_scale, 0.0), do.dtype, UPCAST), do, dv, UPCAST)
    else:
        dv = _dot_acc(_to_dtype(p_t, do.dtype, UPCAST), do, dv, UPCAST)
    dp_t = _dot(v, tl.trans(do), UPCAST)
    if DROPOUT:
        dp_t = tl.where(keep_t, dp_t * dropout_scale, 0.0)
    ds_t = p_t * (dp_t - delta[None, :])
    if SOFTCAP:
        ds_t *= dcap_t
    ds_t = _to_dtype(ds_t, q.dtype, UPCAST)
    dk = _dot_acc(ds_t, q, dk, UPCAST)
    if DQ_ATOMIC:
        dq_t = _dot(tl.trans(k), ds_t, UPCAST)  # [BLOCK_D, BLOCK_M]: (dS K)^T, the head dim as M
        if MASKED:
            tl.atomic_add(dqa_ptrs, dq_t, mask=(offs_m[None, :] < seqlen_q) & (offs_d[:, None] < HEAD_DIM),
                          sem="relaxed")  # fmt: skip
        elif BLOCK_D != HEAD_DIM:
            tl.atomic_add(dqa_ptrs, dq_t, mask=offs_d[:, None] < HEAD_DIM, sem="relaxed")
        else:
            tl.atomic_add(dqa_ptrs, dq_t, sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_blocks(
    dk, dv, k, v, q_base, do_base, dqa_rows, lse_base, delta_base, q_desc, do_desc, desc_batch, desc_row, head,
    stride_qs, stride_dos, offs_n, seqlen_q, seqlen_k, diag, window_left, window_right, qk_scale,
    softcap_in, softcap_out, slope2, lo, hi, rotate, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold,
    dropout_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr, SOFTCAP: tl.constexpr,
    DROPOUT: tl.constexpr, DQ_ATOMIC: tl.constexpr,
    ROTATE: tl.constexpr, TMA: tl.constexpr, HEADS_OUTER: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Query blocks [lo, hi) of one query head against the resident key block; with ROTATE the loop
    starts at block lo + rotate and wraps around. dqa_rows: [BLOCK_D, 1] pointers to this head's
    dQ accumulator rows (one per head-dim index, positions contiguous)."""
    offs_r = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_offs = offs_r[:, None] * stride_qs + offs_d[None, :]
    do_offs = offs_r[:, None] * stride_dos + offs_d[None, :]
    stride_qs64 = stride_qs.to(tl.int64)
    stride_dos64 = stride_dos.to(tl.int64)
    span = hi - lo
    for step in range(0, span, BLOCK_M):
        if ROTATE:
            start_m = step + rotate
            start_m = lo + tl.where(start_m >= span, start_m - span, start_m)
        else:
            start_m = lo + step
        rows = start_m + offs_r
        q = _load_rows(
            q_base, q_desc, desc_batch, desc_row, head, start_m, offs_r, stride_qs64, q_offs, seqlen_q,
            HEAD_DIM, BLOCK_M, BLOCK_D, MASKED, TMA, HEADS_OUTER,
        )  # fmt: skip
        do = _load_rows(
            do_base, do_desc, desc_batch, desc_row, head, start_m, offs_r, stride_dos64, do_offs, seqlen_q,
            HEAD_DIM, BLOCK_M, BLOCK_D, MASKED, TMA, HEADS_OUTER,
        )  # fmt: skip
        if MASKED:
            lse2 = tl.load(lse_base + rows, mask=rows < seqlen_q, other=0.0) * LOG2E
            delta = tl.load(delta_base + rows, mask=rows < seqlen_q, other=0.0)
        else:
            lse2 = tl.load(lse_base + rows) * LOG2E
            delta = tl.load(delta_base + rows)
        dk, dv = _dkdv_update(
            dk, dv, k, v, q, do, lse2, delta, dqa_rows + rows[None, :], rows, offs_n, offs_d, seqlen_q, seqlen_k, diag,
            window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, seed_lo, seed_hi, rng_head,
            rng_offset, dropout_threshold, dropout_scale, HEAD_DIM, BLOCK_D, MASKED, HAS_LEFT, HAS_RIGHT, ALIBI,
            SOFTCAP, DROPOUT, DQ_ATOMIC, UPCAST,
        )  # fmt: skip
    return dk, dv


@triton.jit(do_not_specialize=["n_kv_heads", *_SIZES, *_SMALL_STRIDES])
def _attn_bwd_dkdv_kernel(
    # pointers
    q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, dq_accum_ptr, lse_ptr, delta_ptr, slopes_ptr, cu_seqlens_q_ptr,
    cu_seqlens_k_ptr, rng_ptr, q_desc, do_desc,
    # strides (batch, position, head); the head dim has unit stride. delta shares the LSE's strides.
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dkb, stride_dks, stride_dkh,
    stride_dvb, stride_dvs, stride_dvh,
    stride_dqab, stride_dqah, stride_dqad,
    stride_lse_b, stride_lse_h,
    stride_slope_b, stride_slope_h,
    # sizes and options (total_q, total_k: the packed tensors' rows, varlen)
    n_kv_heads, kv_group, max_seqlen_q, max_seqlen_k, total_q, total_k, softmax_scale, softcap_in, softcap_out,
    window_left, window_right, dropout_threshold, dropout_scale,
    # meta-parameters
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr,
    DQ_ATOMIC: tl.constexpr, UPCAST: tl.constexpr, HEADS_OUTER: tl.constexpr, BLOCK_MAJOR: tl.constexpr,
    # the autotuned ones last: Triton 2.2's autotuner indexes its key by position among the passed arguments
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr,
):  # fmt: skip
    num_n_blocks = tl.cdiv(max_seqlen_k, BLOCK_N)
    # Key blocks in order: under a causal mask the first keys are seen by the most queries, so the
    # longest programs start first.
    pid_n, batch_head = _program_block(num_n_blocks, BLOCK_MAJOR)
    batch = batch_head // n_kv_heads
    kv_head = batch_head % n_kv_heads
    q_start, seqlen_q = _seq_bounds(cu_seqlens_q_ptr, batch, max_seqlen_q, total_q, IS_VARLEN)
    k_start, seqlen_k = _seq_bounds(cu_seqlens_k_ptr, batch, max_seqlen_k, total_k, IS_VARLEN)
    n0 = pid_n * BLOCK_N
    if IS_VARLEN:
        if n0 >= seqlen_k:
            return
        desc_batch = 0
    else:
        desc_batch = batch
    diag = seqlen_k - seqlen_q

    batch64 = batch.to(tl.int64)
    row0 = (k_start + n0).to(tl.int64)
    offs_c = tl.arange(0, BLOCK_N)
    offs_n = n0 + offs_c
    offs_d = tl.arange(0, BLOCK_D)
    k_base = k_ptr + batch64 * stride_kb + row0 * stride_ks + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + batch64 * stride_vb + row0 * stride_vs + kv_head.to(tl.int64) * stride_vh
    k = _load_tile(
        k_base + offs_c[:, None] * stride_ks + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM, True,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    v = _load_tile(
        v_base + offs_c[:, None] * stride_vs + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM, True,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    qk_scale = softmax_scale * LOG2E
    # Queries that see this key block; keys past the tail need no mask here (their rows of dK/dV
    # are never stored, and with DQ_ATOMIC they are zero rows of K: they add nothing to dQ), so
    # the range is computed over the block's real keys.
    last_n = tl.minimum(n0 + BLOCK_N, seqlen_k) - 1
    start, full_start, full_end, end = _band_blocks(
        n0 - diag, last_n - diag, seqlen_q, window_right, window_left, HAS_RIGHT, HAS_LEFT, BLOCK_M
    )
    rotate = full_start * 0
    if DQ_ATOMIC:
        # A key block with a ragged tail takes every query block through the masked path (its
        # dQ shares must exclude the missing keys).
        full_end = tl.where(n0 + BLOCK_N > seqlen_k, full_start, full_end)
        if not HAS_RIGHT:
            # No right bound (full or left-window ranges): the key blocks of one head would all
            # start at the same query block; each starts at its own offset instead, so programs
            # running side by side add into different dQ rows.
            span = full_end - full_start
            rotate = ((n0 // BLOCK_M) * BLOCK_M) % tl.maximum(span, BLOCK_M)

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    q_row0 = q_start.to(tl.int64)
    dqa_dim_offs = offs_d.to(tl.int64)[:, None] * stride_dqad
    for group_index in range(kv_group):
        head = kv_head * kv_group + group_index
        head64 = head.to(tl.int64)
        q_base = q_ptr + batch64 * stride_qb + q_row0 * stride_qs + head64 * stride_qh
        do_base = do_ptr + batch64 * stride_dob + q_row0 * stride_dos + head64 * stride_doh
        dqa_rows = dq_accum_ptr + batch64 * stride_dqab + head64 * stride_dqah + q_row0 + dqa_dim_offs
        lse_base = lse_ptr + batch64 * stride_lse_b + head64 * stride_lse_h + q_start
        delta_base = delta_ptr + batch64 * stride_lse_b + head64 * stride_lse_h + q_start
        slope2 = _alibi_slope2(slopes_ptr, batch, head, stride_slope_b, stride_slope_h, ALIBI)
        seed_lo, seed_hi, rng_head, rng_offset = _rng_words(rng_ptr, batch, n_kv_heads * kv_group, head, DROPOUT)
        if HAS_RIGHT:
            dk, dv = _dkdv_blocks(
                dk, dv, k, v, q_base, do_base, dqa_rows, lse_base, delta_base, q_desc, do_desc, desc_batch, q_start,
                head, stride_qs, stride_dos, offs_n, seqlen_q, seqlen_k, diag, window_left, window_right, qk_scale,
                softcap_in, softcap_out, slope2, start, full_start, rotate, seed_lo, seed_hi, rng_head, rng_offset,
                dropout_threshold, dropout_scale, HEAD_DIM, BLOCK_D, BLOCK_M, True, HAS_LEFT, HAS_RIGHT, ALIBI, SOFTCAP,
                DROPOUT, DQ_ATOMIC, False, USE_TMA and not IS_VARLEN, HEADS_OUTER, UPCAST,
            )  # fmt: skip
        dk, dv = _dkdv_blocks(
            dk, dv, k, v, q_base, do_base, dqa_rows, lse_base, delta_base, q_desc, do_desc, desc_batch, q_start, head,
            stride_qs, stride_dos, offs_n, seqlen_q, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in,
            softcap_out, slope2, full_start, full_end, rotate, seed_lo, seed_hi, rng_head, rng_offset,
            dropout_threshold, dropout_scale, HEAD_DIM, BLOCK_D, BLOCK_M, False, HAS_LEFT, HAS_RIGHT, ALIBI, SOFTCAP,
            DROPOUT, DQ_ATOMIC, DQ_ATOMIC and not HAS_RIGHT, USE_TMA, HEADS_OUTER, UPCAST,
        )  # fmt: skip
        dk, dv = _dkdv_blocks(
            dk, dv, k, v, q_base, do_base, dqa_rows, lse_base, delta_base, q_desc, do_desc, desc_batch, q_start, head,
            stride_qs, stride_dos, offs_n, seqlen_q, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in,
            softcap_out, slope2, full_end, end, rotate, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold,
            dropout_scale, HEAD_DIM, BLOCK_D, BLOCK_M, True, HAS_LEFT, HAS_RIGHT, ALIBI, SOFTCAP, DROPOUT, DQ_ATOMIC,
            False, USE_TMA and not IS_VARLEN, HEADS_OUTER, UPCAST,
        )  # fmt: skip

    dk_ptrs = dk_ptr + batch64 * stride_dkb + row0 * stride_dks + kv_head.to(tl.int64) * stride_dkh
    dv_ptrs = dv_ptr + batch64 * stride_dvb + row0 * stride_dvs + kv_head.to(tl.int64) * stride_dvh
    _store_tile(
        dk_ptrs + offs_c[:, None] * stride_dks + offs_d[None, :],
        _to_dtype(dk * softmax_scale, dk_ptr.dtype.element_ty, UPCAST), offs_n, seqlen_k, offs_d, HEAD_DIM,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    _store_tile(
        dv_ptrs + offs_c[:, None] * stride_dvs + offs_d[None, :], _to_dtype(dv, dv_ptr.dtype.element_ty, UPCAST),
        offs_n, seqlen_k, offs_d, HEAD_DIM, BLOCK_D != HEAD_DIM,
    )  # fmt: skip


@triton.jit(do_not_specialize=["n_heads", "max_seqlen_q", "total_q"])
def _attn_bwd_dq_convert_kernel(
    # pointers
    dq_accum_ptr, dq_ptr, cu_seqlens_q_ptr,
    # strides
    stride_dqab, stride_dqah, stride_dqad,
    stride_dqb, stride_dqs, stride_dqh,
    # sizes and options (total_q: the packed tensors' rows, varlen)
    n_heads, max_seqlen_q, total_q, softmax_scale,
    # meta-parameters
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, IS_VARLEN: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """dQ = softmax_scale * the fp32 accumulator, in dQ's dtype; one program per (query block, batch, head)."""
    batch64, head64, q_start, seqlen_q, m0 = _query_block(
        cu_seqlens_q_ptr, n_heads, max_seqlen_q, total_q, BLOCK_M, IS_VARLEN
    )
    if IS_VARLEN:
        if m0 >= seqlen_q:
            return
    row0 = (q_start + m0).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_M)
    offs_m = m0 + offs_r
    offs_d = tl.arange(0, BLOCK_D)
    dqa_ptrs = dq_accum_ptr + batch64 * stride_dqab + head64 * stride_dqah + row0
    dq_ptrs = dq_ptr + batch64 * stride_dqb + row0 * stride_dqs + head64 * stride_dqh
    dq = _load_tile(
        dqa_ptrs + offs_d.to(tl.int64)[None, :] * stride_dqad + offs_r[:, None], offs_m, seqlen_q, offs_d, HEAD_DIM,
        True, BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    _store_tile(
        dq_ptrs + offs_r[:, None] * stride_dqs + offs_d[None, :],
        _to_dtype(dq * softmax_scale, dq_ptr.dtype.element_ty, UPCAST), offs_m, seqlen_q, offs_d, HEAD_DIM,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip


@triton.jit
def _dq_update(
    dq, q, do, k, v, lse2, delta, offs_m, offs_n, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in,
    softcap_out, slope2, key_bias, row_bias, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, dropout_scale,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr,
    ALIBI_FAR: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One key block's contribution to a query block's dQ (before the softmax scale). ALIBI_FAR: a
    fully visible block far off the diagonal, its bias key_bias[c] + row_bias[r] (common.py)."""
    qk = _dot(q, tl.trans(k), UPCAST)
    if SOFTCAP:
        s, dcap = _softcap_scores(qk, softcap_in, softcap_out)
    else:
        s = qk * qk_scale
    if ALIBI_FAR:
        p = tl.math.exp2(s + key_bias[None, :] - (lse2 - row_bias)[:, None])
    else:
        if ALIBI:
            s += _alibi_tile(offs_m[:, None], offs_n[None, :], diag, slope2)
        p = tl.math.exp2(s - lse2[:, None])
    if MASKED:
        visible = _band_mask(offs_m[:, None], offs_n[None, :], diag, window_left, window_right, HAS_LEFT, HAS_RIGHT)
        p = tl.where(visible & (offs_n[None, :] < seqlen_k), p, 0.0)
    dp = _dot(do, tl.trans(v), UPCAST)
    if DROPOUT:
        keep = _dropout_keep(
            offs_m[:, None], offs_n[None, :], seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold
        )
        dp = tl.where(keep, dp * dropout_scale, 0.0)
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        ds *= dcap
    return _dot_acc(_to_dtype(ds, k.dtype, UPCAST), k, dq, UPCAST)


@triton.jit
def _dq_blocks(
    dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, desc_batch, desc_row, kv_head, stride_ks, stride_vs,
    offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, lo, hi, far_sign,
    seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, dropout_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALIBI: tl.constexpr, ALIBI_FAR: tl.constexpr,
    SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr, TMA: tl.constexpr, HEADS_OUTER: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """Key blocks [lo, hi) against the resident query block; ALIBI_FAR as in the forward's _fwd_blocks."""
    offs_n = tl.arange(0, BLOCK_N)
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
        dq = _dq_update(
            dq, q, do, k, v, lse2, delta, offs_m, start_n + offs_n, seqlen_k, diag, window_left, window_right, qk_scale,
            softcap_in, softcap_out, slope2, key_bias, row_bias, seed_lo, seed_hi, rng_head, rng_offset,
            dropout_threshold, dropout_scale, MASKED, HAS_LEFT, HAS_RIGHT, ALIBI, ALIBI_FAR, SOFTCAP, DROPOUT, UPCAST,
        )  # fmt: skip
    return dq


@triton.jit(do_not_specialize=["n_heads", *_SIZES, *_SMALL_STRIDES])
def _attn_bwd_dq_kernel(
    # pointers
    q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr, slopes_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr,
    rng_ptr, k_desc, v_desc,
    # strides (batch, position, head); the head dim has unit stride. delta shares the LSE's strides.
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dqb, stride_dqs, stride_dqh,
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
        desc_batch = 0
    else:
        desc_batch = batch
    diag = seqlen_k - seqlen_q

    batch64 = batch.to(tl.int64)
    head64 = head.to(tl.int64)
    row0 = (q_start + m0).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_M)
    offs_m = m0 + offs_r
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = q_ptr + batch64 * stride_qb + row0 * stride_qs + head64 * stride_qh
    do_ptrs = do_ptr + batch64 * stride_dob + row0 * stride_dos + head64 * stride_doh
    q = _load_tile(
        q_ptrs + offs_r[:, None] * stride_qs + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, True,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    do = _load_tile(
        do_ptrs + offs_r[:, None] * stride_dos + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, True,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    lse_offs = batch64 * stride_lse_b + head64 * stride_lse_h + q_start + offs_m
    lse2 = tl.load(lse_ptr + lse_offs, mask=offs_m < seqlen_q, other=0.0) * LOG2E
    delta = tl.load(delta_ptr + lse_offs, mask=offs_m < seqlen_q, other=0.0)
    qk_scale = softmax_scale * LOG2E
    slope2 = _alibi_slope2(slopes_ptr, batch, head, stride_slope_b, stride_slope_h, ALIBI)
    seed_lo, seed_hi, rng_head, rng_offset = _rng_words(rng_ptr, batch, n_heads, head, DROPOUT)

    k_base = k_ptr + batch64 * stride_kb + k_start.to(tl.int64) * stride_ks + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + batch64 * stride_vb + k_start.to(tl.int64) * stride_vs + kv_head.to(tl.int64) * stride_vh
    last_m = tl.minimum(m0 + BLOCK_M, seqlen_q) - 1
    start, full_start, full_end, end = _band_blocks(
        m0 + diag, last_m + diag, seqlen_k, window_left, window_right, HAS_LEFT, HAS_RIGHT, BLOCK_N
    )
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if HAS_LEFT:
        dq = _dq_blocks(
            dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks, stride_vs,
            offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, start,
            full_start, 1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, dropout_scale, HEAD_DIM,
            BLOCK_D, BLOCK_N, True, HAS_LEFT, HAS_RIGHT, ALIBI, False, SOFTCAP, DROPOUT, USE_TMA and not IS_VARLEN,
            HEADS_OUTER, UPCAST,
        )  # fmt: skip
    # ALiBi in dense batches, as in the forward (kernels/attention_fwd.py): the far blocks in the
    # rank-1 form after the near ones; with a right bound the near ones join the masked loop,
    # which then runs first.
    masked_start = full_end
    if ALIBI and not IS_VARLEN:
        below_end, above_start = _alibi_far_split(m0 + diag, last_m + diag, full_start, full_end, BLOCK_N, BLOCK_N)
        if HAS_RIGHT:
            masked_start = below_end
    if (ALIBI and HAS_RIGHT) and not IS_VARLEN:
        dq = _dq_blocks(
            dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks, stride_vs,
            offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, masked_start,
            end, 1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, dropout_scale, HEAD_DIM, BLOCK_D,
            BLOCK_N, True, HAS_LEFT, HAS_RIGHT, ALIBI, False, SOFTCAP, DROPOUT, USE_TMA, HEADS_OUTER, UPCAST,
        )  # fmt: skip
    if ALIBI and not IS_VARLEN:
        if not HAS_RIGHT:
            dq = _dq_blocks(
                dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks,
                stride_vs, offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2,
                below_end, above_start, 1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, dropout_scale,
                HEAD_DIM, BLOCK_D, BLOCK_N, False, HAS_LEFT, HAS_RIGHT, ALIBI, False, SOFTCAP, DROPOUT, USE_TMA,
                HEADS_OUTER, UPCAST,
            )  # fmt: skip
        dq = _dq_blocks(
            dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks, stride_vs,
            offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, full_start,
            below_end, 1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, dropout_scale, HEAD_DIM, BLOCK_D,
            BLOCK_N, False, HAS_LEFT, HAS_RIGHT, ALIBI, True, SOFTCAP, DROPOUT, USE_TMA, HEADS_OUTER, UPCAST,
        )  # fmt: skip
        if not HAS_RIGHT:
            dq = _dq_blocks(
                dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks,
                stride_vs, offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2,
                above_start, full_end, -1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, dropout_scale,
                HEAD_DIM, BLOCK_D, BLOCK_N, False, HAS_LEFT, HAS_RIGHT, ALIBI, True, SOFTCAP, DROPOUT, USE_TMA,
                HEADS_OUTER, UPCAST,
            )  # fmt: skip
    else:
        dq = _dq_blocks(
            dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks, stride_vs,
            offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, full_start,
            full_end, 1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, dropout_scale, HEAD_DIM, BLOCK_D,
            BLOCK_N, False, HAS_LEFT, HAS_RIGHT, ALIBI, False, SOFTCAP, DROPOUT, USE_TMA, HEADS_OUTER, UPCAST,
        )  # fmt: skip
    if not ((ALIBI and HAS_RIGHT) and not IS_VARLEN):
        dq = _dq_blocks(
            dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, desc_batch, k_start, kv_head, stride_ks, stride_vs,
            offs_m, seqlen_k, diag, window_left, window_right, qk_scale, softcap_in, softcap_out, slope2, masked_start,
            end, 1.0, seed_lo, seed_hi, rng_head, rng_offset, dropout_threshold, dropout_scale, HEAD_DIM, BLOCK_D,
            BLOCK_N, True, HAS_LEFT, HAS_RIGHT, ALIBI, False, SOFTCAP, DROPOUT, USE_TMA and not IS_VARLEN, HEADS_OUTER,
            UPCAST,
        )  # fmt: skip

    dq_ptrs = dq_ptr + batch64 * stride_dqb + row0 * stride_dqs + head64 * stride_dqh
    _store_tile(
        dq_ptrs + offs_r[:, None] * stride_dqs + offs_d[None, :],
        _to_dtype(dq * softmax_scale, dq_ptr.dtype.element_ty, UPCAST), offs_m, seqlen_q, offs_d, HEAD_DIM,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip
