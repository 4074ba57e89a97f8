"""The dK/dV kernel for Hopper, in Gluon (Triton 3.6's `triton.experimental.gluon`).

Scope: 16-bit dense batches, head dim 64 or 128, causal (equal lengths) or full attention, any
lengths, GQA/MQA, no ALiBi, softcap, dropout or window; every other case runs the portable
kernel (attention_bwd.py), as does every GPU but sm_90 and every Triton but 3.6 (ops/launch.py
decides).

Same mathematics as attention_bwd's dK/dV kernel: one program per (key block, batch, kv head),
K and V resident in shared memory, looping over the query heads of the group and over the query
blocks that see the key block:

    S^T = K Q^T, P^T = exp2(S^T * scale * log2(e) - LSE * log2(e)), dP^T = V dO^T
    dV += P^T dO, dS^T = P^T * (dP^T - delta), dK += dS^T Q         (dK scaled once at the end)

What the Triton kernel cannot express: Q and dO stream through a ring of STAGES TMA buffers, and
the four products are asynchronous warpgroup MMAs with explicit waits. S^T and dP^T of block j
are issued together; the softmax of S^T runs while dP^T is still in the tensor cores, and block
j's dV and dK products stay in flight while block j + 1's S^T and dP^T issue. P^T and dS^T feed
their products from registers (an accumulator's layout is the A-operand layout of the next
product: no data moves). Masks are arithmetic (a select on the scores made ptxas serialize the
wgmmas, its note C7515), on the diagonal blocks only, in a loop of their own. Query rows past the
sequence (TMA fills them with zeros) get an infinite LSE: P^T = 0, so they add nothing.

Tensors are 4-D TMA views, (batch, head, position, dim) or (batch, position, head, dim)
(HEADS_OUTER false), as ops/launch.py describes them; dK and dV are stored through their strides.
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

LOG2E = gl.constexpr(1.4426950408889634)
# The TMA load: Triton 3.6's name, renamed async_load later (so that the kernel also compiles, ahead
# of time, under the newer Tritons of the test matrix).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _program_block(n_blocks, BLOCK_MAJOR: gl.constexpr):
    """(block, batch-head) of this program, as kernels/common.py's _program_block: head-major, or
    block-major in groups of 8 batch-heads (the longest causal programs of 8 heads start together)."""
    pid = gl.program_id(0)
    if BLOCK_MAJOR:
        n_batch_heads = gl.num_programs(0) // n_blocks
        group = pid // (8 * n_blocks)
        size = gl.minimum(8, n_batch_heads - group * 8)
        rest = pid - group * 8 * n_blocks
        return rest // size, group * 8 + rest % size
    else:
        return pid % n_blocks, pid // n_blocks


@gluon.jit
def _rows(bufs, index):
    """Buffer `index` of a ring of 4-D TMA blocks, as the [rows, head dim] matrix it holds."""
    shape: gl.constexpr = bufs.type.shape
    return bufs.index(index).reshape([shape[1] * shape[2] * shape[3], shape[4]])


@gluon.jit
def _issue_pair(a_desc, b_desc, a_bufs, b_bufs, ready, step, batch, head, row, valid, HEADS_OUTER: gl.constexpr):
    """TMA loads of one block (rows [row, row + block) of batch `batch`, head `head`) of two
    tensors into stage step % STAGES of their rings, if valid."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    s = step % STAGES
    mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=valid)
    if HEADS_OUTER:
        coords = [batch, head, row, 0]
    else:
        coords = [batch, row, head, 0]
    _tma_load(a_desc, coords, ready.index(s), a_bufs.index(s), pred=valid)
    _tma_load(b_desc, coords, ready.index(s), b_bufs.index(s), pred=valid)


@gluon.jit
def _barriers(count: gl.constexpr):
    """`count` initialized mbarriers (one arrival each)."""
    bars = gl.allocate_shared_memory(gl.int64, [count, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(count):
        mbarrier.init(bars.index(i), count=1)
    return bars


@gluon.jit
def _ring(desc, STAGES: gl.constexpr):
    """STAGES shared-memory buffers of desc's block (one for a resident tile)."""
    return gl.allocate_shared_memory(desc.dtype, [STAGES] + desc.block_type.shape, desc.layout)


@gluon.jit
def _next_step(g, j, n_masked, n_per_head, kv_group):
    """(head in the group, query block) of the step after (g, j). The masked (diagonal) block of
    every head comes first, then the rest of every head's blocks. Selects, not divisions: a
    division's branches inside the wgmma pipeline made ptxas serialize it (C7514)."""
    masked = j < n_masked
    last_head = g + 1 >= kv_group
    last_block = j + 1 >= n_per_head
    g_next = gl.where(masked, gl.where(last_head, 0, g + 1), g + last_block.to(gl.int32))
    j_next = gl.where(masked, gl.where(last_head, n_masked, j), gl.where(last_block, n_masked, j + 1))
    return g_next, j_next


@gluon.jit
def _query_step(
    t, g, j, g_ahead, j_ahead, dv, dk, k_smem, v_smem, q_desc, do_desc, q_bufs, do_bufs, ready, lse_ptr, delta_ptr,
    stride_lse_b, stride_lse_h, batch, kv_head, kv_group, m_lo, n_masked, n_per_head, n_steps, seqlen_q, keys, cols,
    zero_s, qk_scale, MASKED: gl.constexpr, HEADS_OUTER: gl.constexpr, a_layout: gl.constexpr,
):  # fmt: skip
    """Step t of the program, query block j of head g of the group: its dV and dK products issued
    and left in flight; step t + STAGES - 1's loads (block j_ahead of head g_ahead) issued once
    step t - 1's stage frees. Returns the accumulators and the next step's coordinates."""
    STAGES: gl.constexpr = q_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[1] * q_bufs.type.shape[2] * q_bufs.type.shape[3]
    dtype: gl.constexpr = q_bufs.dtype
    s = t % STAGES
    head = kv_head * kv_group + g
    m = m_lo + j * BLOCK_M
    if MASKED:
        # Keys past the query: -1e30 and more below the LSE, exp2 gives 0. Arithmetic, not a select
        # (see the module docstring).
        bias = gl.minimum((m + cols)[None, :] - keys[:, None], 0).to(gl.float32) * 1.0e30
    mbarrier.wait(ready.index(s), (t // STAGES) & 1)
    q_smem = _rows(q_bufs, s)
    do_smem = _rows(do_bufs, s)
    s_tok = warpgroup_mma(k_smem, q_smem.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    dp_tok = warpgroup_mma(v_smem, do_smem.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    # Rows past the sequence (zero Q and dO rows, TMA's fill) load the last row's delta and take an
    # infinite LSE: P^T = 0 there. A clamped load and a select, not a masked load, which made
    # ptxas serialize the wgmmas of the full-attention kernel (C7515).
    positions = m + cols
    rows_lse = batch * stride_lse_b + head * stride_lse_h + gl.minimum(positions, seqlen_q - 1)
    lse2 = gl.where(positions < seqlen_q, gl.load(lse_ptr + rows_lse) * LOG2E, float("inf"))
    delta = gl.load(delta_ptr + rows_lse)
    # Retires block t - 1's dV and dK products and S^T; dP^T may still run.
    s_t, dv, dk = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, dv, dk))
    ahead = t + STAGES - 1
    _issue_pair(
        q_desc, do_desc, q_bufs, do_bufs, ready, ahead, batch, kv_head * kv_group + g_ahead, m_lo + j_ahead * BLOCK_M,
        ahead < n_steps, HEADS_OUTER,
    )  # fmt: skip
    x_t = s_t * qk_scale - lse2[None, :]
    if MASKED:
        x_t = x_t + bias
    p_t = gl.exp2(x_t)
    dp_t = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
    ds_t = p_t * (dp_t - delta[None, :])
    p_op = gl.convert_layout(p_t.to(dtype), a_layout, assert_trivial=True)
    ds_op = gl.convert_layout(ds_t.to(dtype), a_layout, assert_trivial=True)
    dv = warpgroup_mma(p_op, do_smem, dv, is_async=True)
    dk = warpgroup_mma(ds_op, q_smem, dk, is_async=True)
    g, j = _next_step(g, j, n_masked, n_per_head, kv_group)
    g_ahead, j_ahead = _next_step(g_ahead, j_ahead, n_masked, n_per_head, kv_group)
    return dv, dk, g, j, g_ahead, j_ahead


@gluon.jit
def _attn_bwd_dkdv_hopper_kernel(
    q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh, stride_lse_b, stride_lse_h,
    n_kv_heads, kv_group, seqlen_q, seqlen_k, qk_scale, softmax_scale,
    CAUSAL: gl.constexpr, HEADS_OUTER: gl.constexpr, BLOCK_MAJOR: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    num_warps: gl.constexpr = gl.num_warps()  # the compile option (not a parameter: Launch passes options)
    ROW_DIM: gl.constexpr = 2 if HEADS_OUTER else 1
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[ROW_DIM]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[ROW_DIM]
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[3]
    dtype: gl.constexpr = k_desc.dtype
    # Accumulators: S^T and dP^T [BLOCK_N, BLOCK_M], dK and dV [BLOCK_N, HEAD_DIM]; warps along the keys.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M, 16]
    )
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)

    n_blocks = gl.cdiv(seqlen_k, BLOCK_N)
    pid_n, batch_head = _program_block(n_blocks, BLOCK_MAJOR)
    batch = batch_head // n_kv_heads
    kv_head = batch_head % n_kv_heads
    n0 = pid_n * BLOCK_N

    k_res = _ring(k_desc, 1)
    v_res = _ring(v_desc, 1)
    q_bufs = _ring(q_desc, STAGES)
    do_bufs = _ring(do_desc, STAGES)
    kv_ready = _barriers(1)
    ready = _barriers(STAGES)
    _issue_pair(k_desc, v_desc, k_res, v_res, kv_ready, 0, batch, kv_head, n0, True, HEADS_OUTER)
    k_smem = _rows(k_res, 0)
    v_smem = _rows(v_res, 0)

    # Query blocks [m_lo, seqlen_q) of each head of the group: under a causal mask from the key
    # block's first key, the first of them on the diagonal.
    if CAUSAL:
        gl.static_assert(BLOCK_M == BLOCK_N, "one diagonal query block per key block")
        m_lo = n0
        n_per_head = gl.cdiv(seqlen_q - m_lo, BLOCK_M)
        n_masked = 1
    else:
        m_lo = 0
        n_per_head = gl.cdiv(seqlen_q, BLOCK_M)
        n_masked = 0
    n_steps = n_per_head * kv_group
    g_ahead = gl.to_tensor(0)
    j_ahead = gl.to_tensor(0)
    for p in gl.static_range(STAGES - 1):
        _issue_pair(
            q_desc, do_desc, q_bufs, do_bufs, ready, p, batch, kv_head * kv_group + g_ahead, m_lo + j_ahead * BLOCK_M,
            p < n_steps, HEADS_OUTER,
        )  # fmt: skip
        g_ahead, j_ahead = _next_step(g_ahead, j_ahead, n_masked, n_per_head, kv_group)

    keys = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    dv = warpgroup_mma_init(gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout))
    dk = warpgroup_mma_init(gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout))
    mbarrier.wait(kv_ready.index(0), 0)
    g = gl.to_tensor(0)
    j = gl.to_tensor(0)
    # The diagonal blocks (causal), then the rest: two loops, the mask a constexpr of each. (Under
    # full attention no first loop at all: an empty one made ptxas serialize the wgmmas, C7515.)
    if CAUSAL:
        for t in range(kv_group):
            dv, dk, g, j, g_ahead, j_ahead = _query_step(
                t, g, j, g_ahead, j_ahead, dv, dk, k_smem, v_smem, q_desc, do_desc, q_bufs, do_bufs, ready, lse_ptr,
                delta_ptr, stride_lse_b, stride_lse_h, batch, kv_head, kv_group, m_lo, n_masked, n_per_head, n_steps,
                seqlen_q, keys, cols, zero_s, qk_scale, True, HEADS_OUTER, a_layout,
            )  # fmt: skip
        first = kv_group
    else:
        first = 0
    for t in range(first, n_steps):
        dv, dk, g, j, g_ahead, j_ahead = _query_step(
            t, g, j, g_ahead, j_ahead, dv, dk, k_smem, v_smem, q_desc, do_desc, q_bufs, do_bufs, ready, lse_ptr,
            delta_ptr, stride_lse_b, stride_lse_h, batch, kv_head, kv_group, m_lo, n_masked, n_per_head, n_steps,
            seqlen_q, keys, cols, zero_s, qk_scale, False, HEADS_OUTER, a_layout,
        )  # fmt: skip
    dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))

    rows = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kv_layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
    inside = (rows < seqlen_k)[:, None]
    rows64 = rows.to(gl.int64)[:, None]
    batch64 = batch.to(gl.int64)
    kv_head64 = kv_head.to(gl.int64)
    dk_offs = batch64 * stride_dkb + kv_head64 * stride_dkh + rows64 * stride_dks + dims[None, :]
    dv_offs = batch64 * stride_dvb + kv_head64 * stride_dvh + rows64 * stride_dvs + dims[None, :]
    gl.store(dk_ptr + dk_offs, (dk * softmax_scale).to(dtype), mask=inside)
    gl.store(dv_ptr + dv_offs, dv.to(dtype), mask=inside)


# The config: BLOCK_M (query rows per step) x BLOCK_N (keys per program), warps, and the Q/dO ring's
# stages per head dim. One warpgroup per 64 keys measured fastest of those tried on an H200; three
# stages at D = 128 need more shared memory than two programs per SM leave (measured 1.3x slower).
BLOCK_M, BLOCK_N, NUM_WARPS = 64, 64, 4
STAGES = {64: 3, 128: 2}
