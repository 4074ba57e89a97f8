"""Lab: attention kernels for Hopper in Gluon (Triton 3.6): async wgmma with explicit waits.

Dense BHSD tensors, S a multiple of the blocks, causal (equal lengths) or full, no other options.
One program per (block, batch x head); the resident operands in shared memory, the streamed ones
through a ring of STAGES TMA buffers; P (or P^T, dS^T, dS) feed their products from registers
(an accumulator's layout is the A-operand layout of the next product: no data moves). Masks are
arithmetic (a select on the scores made ptxas serialize the wgmmas, its note C7515), applied on
the diagonal blocks only, in a loop of their own.

- `_gluon_dkdv_kernel`: dV = sum P^T dO, dK = scale * sum dS^T Q, key block resident. Per query
  block, S^T and dP^T are issued together and the softmax of S^T runs while dP^T is still in the
  tensor cores; the dV and dK products stay in flight while the next block's S^T and dP^T issue.
- `_gluon_dq_kernel`: dQ = scale * sum dS K, query block resident, the same overlap.
- `_gluon_fwd_kernel`: O and the LSE. Block j + 1's scores are issued before block j's softmax,
  which runs beside them and beside block j - 1's P V (FlashAttention-3's intra-warpgroup overlap).

Not shipped: `attn_gluon_lab.py` checks them against SDPA and times them against the package.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from fused_attention.kernels.attention_bwd_hopper import _barriers, _ring

LOG2E = 1.4426950408889634


@gluon.jit
def _issue_pair(a_desc, b_desc, a_bufs, b_bufs, ready, step, row, valid):
    """TMA loads of rows [row, row + block) of two tensors (Q and dO, or K and V) into stage
    step % STAGES of their rings, if valid."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    s = step % STAGES
    mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=valid)
    tma.async_copy_global_to_shared(a_desc, [row, 0], ready.index(s), a_bufs.index(s), pred=valid)
    tma.async_copy_global_to_shared(b_desc, [row, 0], ready.index(s), b_bufs.index(s), pred=valid)


@gluon.jit
def _dkdv_step(j, dv, dk, k_smem, v_smem, q_desc, do_desc, q_bufs, do_bufs, ready, lse2_ptr, delta_ptr, row0, m_lo,
               n_steps, keys, cols, zero_s, qk_scale, MASKED: gl.constexpr, a_layout: gl.constexpr):  # fmt: skip
    """Query block j of the program's range: its dV and dK products issued, left in flight."""
    STAGES: gl.constexpr = q_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[1]
    dtype: gl.constexpr = q_bufs.dtype
    s = j % STAGES
    m = m_lo + j * BLOCK_M
    if MASKED:
        # Keys past the query: -1e30 and more below the LSE, exp2 gives 0. Arithmetic, not a
        # select: a select on these scores made ptxas serialize the kernel's wgmmas (C7515).
        bias = gl.minimum((m + cols)[None, :] - keys[:, None], 0).to(gl.float32) * 1.0e30
    mbarrier.wait(ready.index(s), (j // STAGES) & 1)
    s_tok = warpgroup_mma(k_smem, q_bufs.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    dp_tok = warpgroup_mma(v_smem, do_bufs.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    lse2 = gl.load(lse2_ptr + row0 + m + cols)
    delta = gl.load(delta_ptr + row0 + m + cols)
    # Retires block j - 1's dV and dK products and S^T; dP^T may still run.
    s_t, dv, dk = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, dv, dk))
    # Block j - 1's stage is free: it takes the block STAGES - 1 ahead of this one.
    ahead = j + STAGES - 1
    _issue_pair(q_desc, do_desc, q_bufs, do_bufs, ready, ahead, row0 + m_lo + ahead * BLOCK_M, ahead < n_steps)
    x_t = s_t * qk_scale - lse2[None, :]
    if MASKED:
        x_t = x_t + bias
    p_t = gl.exp2(x_t)
    dp_t = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
    ds_t = p_t * (dp_t - delta[None, :])
    p_op = gl.convert_layout(p_t.to(dtype), a_layout, assert_trivial=True)
    ds_op = gl.convert_layout(ds_t.to(dtype), a_layout, assert_trivial=True)
    dv = warpgroup_mma(p_op, do_bufs.index(s), dv, is_async=True)
    dk = warpgroup_mma(ds_op, q_bufs.index(s), dk, is_async=True)
    return dv, dk


@gluon.jit
def _gluon_dkdv_kernel(
    q_desc, k_desc, v_desc, do_desc, lse2_ptr, delta_ptr, dk_ptr, dv_ptr, seqlen, qk_scale, sm_scale,
    CAUSAL: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    dtype: gl.constexpr = k_desc.dtype
    # Accumulators: S^T and dP^T [BLOCK_N, BLOCK_M], dK and dV [BLOCK_N, HEAD_DIM]; warps along the keys.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])  # fmt: skip
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)

    pid_n = gl.program_id(0)
    bh = gl.program_id(1)
    row0 = bh * seqlen
    n0 = pid_n * BLOCK_N

    k_res = _ring(k_desc, 1)
    v_res = _ring(v_desc, 1)
    q_bufs = _ring(q_desc, STAGES)
    do_bufs = _ring(do_desc, STAGES)
    kv_ready = _barriers(1)
    ready = _barriers(STAGES)
    _issue_pair(k_desc, v_desc, k_res, v_res, kv_ready, 0, row0 + n0, True)
    k_smem = k_res.index(0)
    v_smem = v_res.index(0)

    # Query blocks [m_lo, seqlen): under a causal mask from the first one holding a query >= n0;
    # the first BLOCK_N // BLOCK_M of them straddle the diagonal and are masked.
    if CAUSAL:
        m_lo = n0
        n_masked: gl.constexpr = BLOCK_N // BLOCK_M
    else:
        m_lo = 0
        n_masked: gl.constexpr = 0
    n_steps = (seqlen - m_lo) // BLOCK_M
    for p in gl.static_range(STAGES - 1):
        _issue_pair(q_desc, do_desc, q_bufs, do_bufs, ready, p, row0 + m_lo + p * BLOCK_M, p < n_steps)

    keys = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    dv = warpgroup_mma_init(gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout))
    dk = warpgroup_mma_init(gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout))
    mbarrier.wait(kv_ready.index(0), 0)
    for j in range(n_masked):
        dv, dk = _dkdv_step(j, dv, dk, k_smem, v_smem, q_desc, do_desc, q_bufs, do_bufs, ready, lse2_ptr, delta_ptr,
                            row0, m_lo, n_steps, keys, cols, zero_s, qk_scale, True, a_layout)  # fmt: skip
    for j in range(n_masked, n_steps):
        dv, dk = _dkdv_step(j, dv, dk, k_smem, v_smem, q_desc, do_desc, q_bufs, do_bufs, ready, lse2_ptr, delta_ptr,
                            row0, m_lo, n_steps, keys, cols, zero_s, qk_scale, False, a_layout)  # fmt: skip
    dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))

    rows = row0 + n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kv_layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
    offs = rows[:, None] * HEAD_DIM + dims[None, :]
    gl.store(dk_ptr + offs, (dk * sm_scale).to(dtype))
    gl.store(dv_ptr + offs, dv.to(dtype))


def _descriptors(block_m, block_n, q, k, v, do=None):
    """TMA descriptors of BHSD q, k, v (and do), each seen as (B * H * S, D): the query-side tensors
    in blocks of block_m rows, K and V of block_n."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dim = q.shape[-1]
    dtype = gl.bfloat16 if str(q.dtype) == "torch.bfloat16" else gl.float16

    def descriptor(t, rows):
        layout = gl.NVMMASharedLayout.get_default_for([rows, dim], dtype)
        return TensorDescriptor.from_tensor(t.reshape(-1, dim), [rows, dim], layout)

    descs = (descriptor(q, block_m), descriptor(k, block_n), descriptor(v, block_n))
    return descs if do is None else (*descs, descriptor(do, block_m))


def launch_gluon_dkdv(q, k, v, do, lse2, delta, dk, dv, causal, block_m=64, block_n=128, stages=2, num_warps=8):
    """dK, dV of dense BHSD q, k, v, do (contiguous, 16-bit) into dk, dv; lse2 = LSE * log2(e) and
    delta = rowsum(dO * O), fp32 (B * H * S,)."""
    batch, heads, seqlen, dim = q.shape
    grid = (seqlen // block_n, batch * heads)
    _gluon_dkdv_kernel[grid](
        *_descriptors(block_m, block_n, q, k, v, do), lse2, delta, dk, dv, seqlen, dim**-0.5 * LOG2E, dim**-0.5,
        causal, stages, num_warps=num_warps,
    )  # fmt: skip


@gluon.jit
def _dq_step(j, dq, q_smem, do_smem, k_desc, v_desc, k_bufs, v_bufs, ready, row0, n_steps, lse2, delta, rows,
             cols, zero_s, qk_scale, MASKED: gl.constexpr, a_layout: gl.constexpr):  # fmt: skip
    """Key block j: its dQ product issued, left in flight."""
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    dtype: gl.constexpr = k_bufs.dtype
    s = j % STAGES
    n = j * BLOCK_N
    if MASKED:  # keys past the query (arithmetic, not a select: see _dkdv_step)
        bias = gl.minimum(rows[:, None] - (n + cols)[None, :], 0).to(gl.float32) * 1.0e30
    mbarrier.wait(ready.index(s), (j // STAGES) & 1)
    s_tok = warpgroup_mma(q_smem, k_bufs.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    dp_tok = warpgroup_mma(do_smem, v_bufs.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s_val, dq = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, dq))
    ahead = j + STAGES - 1
    _issue_pair(k_desc, v_desc, k_bufs, v_bufs, ready, ahead, row0 + ahead * BLOCK_N, ahead < n_steps)
    x = s_val * qk_scale - lse2[:, None]
    if MASKED:
        x = x + bias
    p = gl.exp2(x)
    dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
    ds = p * (dp - delta[:, None])
    ds_op = gl.convert_layout(ds.to(dtype), a_layout, assert_trivial=True)
    return warpgroup_mma(ds_op, k_bufs.index(s), dq, is_async=True)


@gluon.jit
def _gluon_dq_kernel(
    q_desc, k_desc, v_desc, do_desc, lse2_ptr, delta_ptr, dq_ptr, seqlen, qk_scale, sm_scale,
    CAUSAL: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """dQ = scale * sum_j dS_j K_j: one program per (query block, batch x head), key blocks streamed."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    q_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=q_layout, k_width=2)

    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)  # the longest causal rows first
    bh = gl.program_id(1)
    row0 = bh * seqlen
    m0 = pid_m * BLOCK_M

    q_res = _ring(q_desc, 1)
    do_res = _ring(do_desc, 1)
    k_bufs = _ring(k_desc, STAGES)
    v_bufs = _ring(v_desc, STAGES)
    q_ready = _barriers(1)
    ready = _barriers(STAGES)
    _issue_pair(q_desc, do_desc, q_res, do_res, q_ready, 0, row0 + m0, True)
    q_smem = q_res.index(0)
    do_smem = do_res.index(0)

    # Key blocks [0, n_steps): under a causal mask up to the block's last query; the last
    # BLOCK_M // BLOCK_N of them straddle the diagonal and are masked.
    if CAUSAL:
        n_steps = (m0 + BLOCK_M) // BLOCK_N
        n_full = m0 // BLOCK_N
    else:
        n_steps = seqlen // BLOCK_N
        n_full = n_steps
    for p in gl.static_range(STAGES - 1):
        _issue_pair(k_desc, v_desc, k_bufs, v_bufs, ready, p, row0 + p * BLOCK_N, p < n_steps)

    rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    lse2 = gl.load(lse2_ptr + row0 + rows)
    delta = gl.load(delta_ptr + row0 + rows)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    dq = warpgroup_mma_init(gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, q_layout))
    mbarrier.wait(q_ready.index(0), 0)
    for j in range(n_full):
        dq = _dq_step(j, dq, q_smem, do_smem, k_desc, v_desc, k_bufs, v_bufs, ready, row0, n_steps, lse2, delta, rows,
                      cols, zero_s, qk_scale, False, a_layout)  # fmt: skip
    for j in range(n_full, n_steps):
        dq = _dq_step(j, dq, q_smem, do_smem, k_desc, v_desc, k_bufs, v_bufs, ready, row0, n_steps, lse2, delta, rows,
                      cols, zero_s, qk_scale, True, a_layout)  # fmt: skip
    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))

    out_rows = row0 + m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, q_layout))
    gl.store(dq_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :], (dq * sm_scale).to(dtype))


def launch_gluon_dq(q, k, v, do, lse2, delta, dq, causal, block_m=128, block_n=64, stages=2, num_warps=8):
    """dQ of dense BHSD q, k, v, do (contiguous, 16-bit) into dq; lse2, delta as launch_gluon_dkdv's."""
    batch, heads, seqlen, dim = q.shape
    grid = (seqlen // block_m, batch * heads)
    _gluon_dq_kernel[grid](
        *_descriptors(block_m, block_n, q, k, v, do), lse2, delta, dq, seqlen, dim**-0.5 * LOG2E, dim**-0.5, causal,
        stages, num_warps=num_warps,
    )  # fmt: skip


@gluon.jit
def _fwd_step(j, acc, m_i, l_i, s_cur, q_smem, k_desc, v_desc, k_bufs, v_bufs, ready, row0, n_steps, rows, cols,
              zero_s, qk_scale, MASKED: gl.constexpr, p_layout: gl.constexpr, o_layout: gl.constexpr):  # fmt: skip
    """Key block j, whose scores s_cur have retired: block j + 1's scores are issued first, the
    softmax of block j runs beside them and beside block j - 1's P V, then block j's P V is issued.
    Returns the state (block j's P V in flight) and block j + 1's scores (retired)."""
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    dtype: gl.constexpr = k_bufs.dtype
    nxt = j + 1
    s_nxt = nxt % STAGES
    mbarrier.wait(ready.index(s_nxt), (nxt // STAGES) & 1, pred=nxt < n_steps)
    s_tok = warpgroup_mma(q_smem, k_bufs.index(s_nxt).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    x = s_cur * qk_scale
    if MASKED:  # keys past the query (arithmetic, not a select: see _dkdv_step)
        x = x + gl.minimum(rows[:, None] - (j * BLOCK_N + cols)[None, :], 0).to(gl.float32) * 1.0e30
    m_new = gl.maximum(m_i, gl.max(x, 1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(x - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, 1)
    # Block j - 1's P V and block j + 1's scores retire (both ran beside the softmax; leaving the
    # scores in flight across the rescale made ptxas serialize the wgmmas, C7514): block j - 1's
    # stage takes block j - 1 + STAGES, and the output is rescaled.
    acc, s_next = warpgroup_mma_wait(num_outstanding=0, deps=(acc, s_tok))
    ahead = j - 1 + STAGES
    _issue_pair(k_desc, v_desc, k_bufs, v_bufs, ready, ahead, row0 + ahead * BLOCK_N, (j >= 1) & (ahead < n_steps))
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout), assert_trivial=True)[:, None]
    p_op = gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True)
    s_j = j % STAGES
    acc = warpgroup_mma(p_op, v_bufs.index(s_j), acc, is_async=True)
    return acc, m_new, l_i, s_next


@gluon.jit
def _gluon_fwd_kernel(
    q_desc, k_desc, v_desc, o_ptr, lse_ptr, seqlen, qk_scale,
    CAUSAL: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """O and the LSE (natural log): one program per (query block, batch x head), K/V streamed."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    dtype: gl.constexpr = q_desc.dtype
    gl.static_assert(STAGES >= 3, "block j + 1's keys must be loaded before block j's stage frees")
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)

    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)  # the longest causal rows first
    bh = gl.program_id(1)
    row0 = bh * seqlen
    m0 = pid_m * BLOCK_M

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_bufs = _ring(k_desc, STAGES)
    v_bufs = _ring(v_desc, STAGES)
    q_ready = _barriers(1).index(0)
    ready = _barriers(STAGES)
    mbarrier.expect(q_ready, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0 + m0, 0], q_ready, q_smem)

    if CAUSAL:
        n_steps = (m0 + BLOCK_M) // BLOCK_N
        n_full = m0 // BLOCK_N
    else:
        n_steps = seqlen // BLOCK_N
        n_full = n_steps
    for p in gl.static_range(STAGES):
        _issue_pair(k_desc, v_desc, k_bufs, v_bufs, ready, p, row0 + p * BLOCK_N, p < n_steps)

    rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = warpgroup_mma_init(gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout))
    mbarrier.wait(q_ready, 0)
    mbarrier.wait(ready.index(0), 0)
    s_cur = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), zero_s, use_acc=False)
    for j in range(n_full):
        acc, m_i, l_i, s_cur = _fwd_step(j, acc, m_i, l_i, s_cur, q_smem, k_desc, v_desc, k_bufs, v_bufs, ready, row0,
                                         n_steps, rows, cols, zero_s, qk_scale, False, p_layout, o_layout)  # fmt: skip
    for j in range(n_full, n_steps):
        acc, m_i, l_i, s_cur = _fwd_step(j, acc, m_i, l_i, s_cur, q_smem, k_desc, v_desc, k_bufs, v_bufs, ready, row0,
                                         n_steps, rows, cols, zero_s, qk_scale, True, p_layout, o_layout)  # fmt: skip
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout), assert_trivial=True)
    out_rows = row0 + m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    gl.store(o_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :], (acc / l_o[:, None]).to(dtype))
    gl.store(lse_ptr + row0 + rows, (m_i + gl.log2(l_i)) * 0.6931471805599453)


def launch_gluon_fwd(q, k, v, o, lse, causal, block_m=128, block_n=64, stages=3, num_warps=8):
    """O into o (q's shape) and the natural-log LSE into lse (B * H * S fp32) of dense BHSD q, k, v."""
    batch, heads, seqlen, dim = q.shape
    grid = (seqlen // block_m, batch * heads)
    _gluon_fwd_kernel[grid](
        *_descriptors(block_m, block_n, q, k, v), o, lse, seqlen, dim**-0.5 * LOG2E, causal, stages,
        num_warps=num_warps,
    )  # fmt: skip
