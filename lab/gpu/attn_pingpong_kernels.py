"""Lab: a warp-specialized attention forward for Hopper in Gluon (Triton 3.6), FlashAttention-3's
inter-warpgroup overlap.

Dense BHSD tensors, S a multiple of 128, causal (equal lengths) or full, no other options. One
program per (128-query block, batch x head), three partitions:
- loader (1 warp): TMA loads of the program's two 64-row Q halves, then K_j and V_j into a ring of
  STAGES buffers; a stage is refilled once both consumers have released it.
- two consumers (one warpgroup each: the default partition and a worker), each owning one Q half:
  per key block, S = Q K_j^T (async wgmma m64), the online softmax, O += P V_j, the stage
  released. While one runs its softmax the other's wgmmas have the tensor cores. With PINGPONG
  the two take turns explicitly (two mbarriers): a consumer issues its matmuls only in its turn
  and hands the turn over at once, so the softmaxes alternate with the other warpgroup's matmuls
  instead of colliding with them. With OVERLAP each consumer also issues block j - 1's P V
  together with block j's S and runs block j's softmax while P V is in flight (FlashAttention-3's
  intra-warpgroup overlap on top of the inter-warpgroup one).
Masks are arithmetic (a select on the scores made ptxas serialize the wgmmas, note C7515), on the
blocks that straddle the diagonal only.

The single-warpgroup kernel of attn_gluon_kernels.py (block j + 1's scores issued before block j's
softmax) did not beat the package's forward; this is the other route FlashAttention-3 takes.
Not shipped: attn_pingpong_lab.py checks it against SDPA and times it against the package's
forward and cuDNN.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LOG2E = 1.4426950408889634
BLOCK_Q = gl.constexpr(128)  # query rows per program: two 64-row halves, one per consumer warpgroup
HALF = gl.constexpr(64)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, ready, empty, row0, m0, n_steps):
    """The Q halves once, then every key block's K and V, STAGES ahead of the slower consumer."""
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0 + m0, 0], q_ready, q_bufs.index(0))
    tma.async_copy_global_to_shared(q_desc, [row0 + m0 + HALF, 0], q_ready, q_bufs.index(1))
    for j in range(n_steps):
        s = j % STAGES
        # Both consumers released the stage's previous block (a fresh barrier passes phase 1).
        mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row0 + j * BLOCK_N, 0], ready.index(s), k_bufs.index(s))
        tma.async_copy_global_to_shared(v_desc, [row0 + j * BLOCK_N, 0], ready.index(s), v_bufs.index(s))


@gluon.jit
def _softmax_step(x, m_i, l_i, rows, cols, j, qk_scale, BLOCK_N: gl.constexpr, MASKED: gl.constexpr):
    """Block j's probabilities (unnormalized, base 2), the running max and sum, the rescale."""
    x = x * qk_scale
    if MASKED:  # keys past the query: -1e30 and more, exp2 gives 0
        x = x + gl.minimum(rows[:, None] - (j * BLOCK_N + cols)[None, :], 0).to(gl.float32) * 1.0e30
    m_new = gl.maximum(m_i, gl.max(x, 1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(x - m_new[:, None])
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha


@gluon.jit
def _consumer_plain(q_bufs, k_bufs, v_bufs, q_ready, ready, empty, my_turn, other_turn, o_ptr, lse_ptr, row0, m0,
                    n_steps, n_full, qk_scale, WHICH: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
    """Q half WHICH (rows m0 + 64 * WHICH ...) against every key block; O and the LSE written."""
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    HEAD_DIM: gl.constexpr = k_bufs.type.shape[2]
    dtype: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q_smem = q_bufs.index(WHICH)
    first = m0 + WHICH * HALF
    rows = first + gl.arange(0, HALF, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([HALF, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([HALF], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([HALF], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([HALF, HEAD_DIM], gl.float32, o_layout)
    mbarrier.wait(q_ready, 0)
    for j in range(n_steps):
        s = j % STAGES
        mbarrier.wait(ready.index(s), (j // STAGES) & 1)
        if PINGPONG:
            mbarrier.wait(my_turn, j & 1)
        s_tok = warpgroup_mma(q_smem, k_bufs.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if PINGPONG:
            mbarrier.arrive(other_turn, count=1)
        x = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        if j < n_full:
            p, m_i, l_i, alpha = _softmax_step(x, m_i, l_i, rows, cols, j, qk_scale, BLOCK_N, False)
        else:
            p, m_i, l_i, alpha = _softmax_step(x, m_i, l_i, rows, cols, j, qk_scale, BLOCK_N, True)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout), assert_trivial=True)[:, None]
        p_op = gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True)
        acc = warpgroup_mma(p_op, v_bufs.index(s), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(s), count=1)
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout), assert_trivial=True)
    out_rows = row0 + first + gl.arange(0, HALF, layout=gl.SliceLayout(1, o_layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    gl.store(o_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :], (acc / l_o[:, None]).to(dtype))
    gl.store(lse_ptr + row0 + rows, (m_i + gl.log2(l_i)) * 0.6931471805599453)


@gluon.jit
def _pv_issue_then_softmax(j, acc, p_prev, m_i, l_i, q_smem, k_bufs, v_bufs, ready, empty, my_turn, other_turn, rows,
                           cols, zero_s, qk_scale, PINGPONG: gl.constexpr, MASKED: gl.constexpr,
                           o_layout: gl.constexpr, p_layout: gl.constexpr):  # fmt: skip
    """Key block j >= 1: S_j and block j - 1's P V issued together (in this warpgroup's turn); the
    softmax of S_j runs while P V is still in the tensor cores; then the rescale, and block
    j - 1's stage released."""
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    dtype: gl.constexpr = k_bufs.dtype
    s = j % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(ready.index(s), (j // STAGES) & 1)
    if PINGPONG:
        mbarrier.wait(my_turn, j & 1)
    s_tok = warpgroup_mma(q_smem, k_bufs.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    acc = warpgroup_mma(p_prev, v_bufs.index(prev), acc, is_async=True)
    if PINGPONG:
        mbarrier.arrive(other_turn, count=1)
    x = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))  # S_j retired, P V may still run
    p, m_i, l_i, alpha = _softmax_step(x, m_i, l_i, rows, cols, j, qk_scale, BLOCK_N, MASKED)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(empty.index(prev), count=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout), assert_trivial=True)[:, None]
    return acc, gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True), m_i, l_i


@gluon.jit
def _consumer_overlapped(q_bufs, k_bufs, v_bufs, q_ready, ready, empty, my_turn, other_turn, o_ptr, lse_ptr, row0,
                         m0, n_steps, n_full, qk_scale, WHICH: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
    """As _consumer_plain, with FlashAttention-3's intra-warpgroup overlap besides: block j - 1's P V
    runs beside block j's softmax (see _pv_issue_then_softmax)."""
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    HEAD_DIM: gl.constexpr = k_bufs.type.shape[2]
    dtype: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q_smem = q_bufs.index(WHICH)
    first = m0 + WHICH * HALF
    rows = first + gl.arange(0, HALF, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([HALF, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([HALF], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([HALF], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([HALF, HEAD_DIM], gl.float32, o_layout)
    mbarrier.wait(q_ready, 0)
    # Block 0: its scores alone (no P V before it).
    mbarrier.wait(ready.index(0), 0)
    if PINGPONG:
        mbarrier.wait(my_turn, 0)
    s_tok = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    if PINGPONG:
        mbarrier.arrive(other_turn, count=1)
    x = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
    if n_full > 0:
        p, m_i, l_i, alpha = _softmax_step(x, m_i, l_i, rows, cols, 0, qk_scale, BLOCK_N, False)
    else:
        p, m_i, l_i, alpha = _softmax_step(x, m_i, l_i, rows, cols, 0, qk_scale, BLOCK_N, True)
    p_prev = gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True)
    for j in range(1, n_full):
        acc, p_prev, m_i, l_i = _pv_issue_then_softmax(
            j, acc, p_prev, m_i, l_i, q_smem, k_bufs, v_bufs, ready, empty, my_turn, other_turn, rows, cols, zero_s,
            qk_scale, PINGPONG, False, o_layout, p_layout,
        )  # fmt: skip
    for j in range(gl.maximum(n_full, 1), n_steps):
        acc, p_prev, m_i, l_i = _pv_issue_then_softmax(
            j, acc, p_prev, m_i, l_i, q_smem, k_bufs, v_bufs, ready, empty, my_turn, other_turn, rows, cols, zero_s,
            qk_scale, PINGPONG, True, o_layout, p_layout,
        )  # fmt: skip
    last = (n_steps - 1) % STAGES
    acc = warpgroup_mma(p_prev, v_bufs.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(empty.index(last), count=1)
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout), assert_trivial=True)
    out_rows = row0 + first + gl.arange(0, HALF, layout=gl.SliceLayout(1, o_layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    gl.store(o_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :], (acc / l_o[:, None]).to(dtype))
    gl.store(lse_ptr + row0 + rows, (m_i + gl.log2(l_i)) * 0.6931471805599453)


@gluon.jit
def _consumer(q_bufs, k_bufs, v_bufs, q_ready, ready, empty, my_turn, other_turn, o_ptr, lse_ptr, row0, m0, n_steps,
              n_full, qk_scale, WHICH: gl.constexpr, PINGPONG: gl.constexpr, OVERLAP: gl.constexpr):  # fmt: skip
    if OVERLAP:
        _consumer_overlapped(q_bufs, k_bufs, v_bufs, q_ready, ready, empty, my_turn, other_turn, o_ptr, lse_ptr, row0,
                             m0, n_steps, n_full, qk_scale, WHICH, PINGPONG)  # fmt: skip
    else:
        _consumer_plain(q_bufs, k_bufs, v_bufs, q_ready, ready, empty, my_turn, other_turn, o_ptr, lse_ptr, row0, m0,
                        n_steps, n_full, qk_scale, WHICH, PINGPONG)  # fmt: skip


@gluon.jit
def _pingpong_fwd_kernel(
    q_desc, k_desc, v_desc, o_ptr, lse_ptr, seqlen, qk_scale,
    CAUSAL: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, OVERLAP: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
):  # fmt: skip
    """O and the natural-log LSE of a 128-query block: grid (S / 128, batch x heads), 4 warps."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    gl.static_assert(q_desc.block_type.shape[0] == HALF, "Q is loaded in 64-row halves")
    gl.static_assert(gl.num_warps() == 4, "the default partition is one consumer warpgroup")
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)  # the longest causal rows first
    row0 = gl.program_id(1) * seqlen
    m0 = pid_m * BLOCK_Q
    if CAUSAL:
        n_steps = gl.cdiv(m0 + BLOCK_Q, BLOCK_N)
        n_full = m0 // BLOCK_N  # blocks wholly below both halves' diagonals
    else:
        n_steps = seqlen // BLOCK_N
        n_full = n_steps
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both consumers release a stage
    mbarrier.init(turns.index(0), count=1)
    mbarrier.init(turns.index(1), count=1)
    if PINGPONG:
        # Consumer 0 starts: its first wait (phase 0) needs one completed phase of its barrier.
        mbarrier.arrive(turns.index(0), count=1)
    gl.warp_specialize(
        [
            (_consumer, (q_bufs, k_bufs, v_bufs, q_ready, ready, empty, turns.index(0), turns.index(1), o_ptr,
                         lse_ptr, row0, m0, n_steps, n_full, qk_scale, 0, PINGPONG, OVERLAP)),
            (_consumer, (q_bufs, k_bufs, v_bufs, q_ready, ready, empty, turns.index(1), turns.index(0), o_ptr,
                         lse_ptr, row0, m0, n_steps, n_full, qk_scale, 1, PINGPONG, OVERLAP)),
            (_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, ready, empty, row0, m0, n_steps)),
        ],
        [4, 1],
        [CONSUMER_REGISTERS, LOADER_REGISTERS],
    )  # fmt: skip


def descriptors(block_n, q, k, v):
    """TMA descriptors of BHSD q (64-row blocks), k and v (block_n rows), each seen as (B * H * S, D)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dim = q.shape[-1]
    dtype = gl.bfloat16 if str(q.dtype) == "torch.bfloat16" else gl.float16

    def descriptor(t, rows):
        layout = gl.NVMMASharedLayout.get_default_for([rows, dim], dtype)
        return TensorDescriptor.from_tensor(t.reshape(-1, dim), [rows, dim], layout)

    return descriptor(q, HALF), descriptor(k, block_n), descriptor(v, block_n)


def launch_pingpong_fwd(q, k, v, o, lse, causal, block_n=128, stages=2, pingpong=True, overlap=False,
                        consumer_registers=232, loader_registers=24):  # fmt: skip
    """O into o (q's shape) and the natural-log LSE into lse (B * H * S fp32) of dense BHSD q, k, v."""
    batch, heads, seqlen, dim = q.shape
    grid = (seqlen // BLOCK_Q, batch * heads)
    _pingpong_fwd_kernel[grid](
        *descriptors(block_n, q, k, v), o, lse, seqlen, dim**-0.5 * LOG2E, causal, stages, pingpong, overlap,
        consumer_registers, loader_registers, num_warps=4,
    )  # fmt: skip
