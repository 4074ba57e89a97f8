import triton
import triton.language as tl


@triton.jit
def _mini_dkdv(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    lse_desc,
    delta_desc,
    dk_ptr,
    dv_ptr,
    seqlen,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WS: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    row0 = bh * seqlen
    n0 = pid_n * BLOCK_N
    k = k_desc.load([row0 + n0, 0])
    v = v_desc.load([row0 + n0, 0])
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo = 0
    if CAUSAL:
        lo = n0
    offs_nn = n0 + tl.arange(0, BLOCK_N)
    for m in tl.range(lo, seqlen, BLOCK_M, warp_specialize=WS):
        q = q_desc.load([row0 + m, 0])
        do = do_desc.load([row0 + m, 0])
        lse = lse_desc.load([row0 + m])
        delta = delta_desc.load([row0 + m])
        s_t = tl.dot(k, tl.trans(q)) * qk_scale
        p_t = tl.math.exp2(s_t - lse[None, :])
        if CAUSAL:
            offs_m = m + tl.arange(0, BLOCK_M)
            p_t = tl.where(offs_m[None, :] >= offs_nn[:, None], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk)
    offs_n = row0 + n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    tl.store(dk_ptr + offs_n[:, None] * HEAD_DIM + offs_d[None, :], (dk * sm_scale).to(dk_ptr.dtype.element_ty))
    tl.store(dv_ptr + offs_n[:, None] * HEAD_DIM + offs_d[None, :], dv.to(dv_ptr.dtype.element_ty))


@triton.jit
def _mini_dq(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    lse_desc,
    delta_desc,
    dq_ptr,
    seqlen,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WS: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    row0 = bh * seqlen
    m0 = pid_m * BLOCK_M
    q = q_desc.load([row0 + m0, 0])
    do = do_desc.load([row0 + m0, 0])
    lse = lse_desc.load([row0 + m0])
    delta = delta_desc.load([row0 + m0])
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = seqlen
    if CAUSAL:
        hi = m0 + BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    for n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
        k = k_desc.load([row0 + n, 0])
        v = v_desc.load([row0 + n, 0])
        s = tl.dot(q, tl.trans(k)) * qk_scale
        p = tl.math.exp2(s - lse[:, None])
        if CAUSAL:
            offs_n = n + tl.arange(0, BLOCK_N)
            p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = (p * (dp - delta[:, None])).to(k.dtype)
        dq = tl.dot(ds, k, dq)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = row0 + offs_m
    tl.store(dq_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], (dq * sm_scale).to(dq_ptr.dtype.element_ty))


@triton.jit
def _mini_fwd(
    q_desc,
    k_desc,
    v_desc,
    o_ptr,
    lse_ptr,
    seqlen,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WS: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    row0 = bh * seqlen
    m0 = pid_m * BLOCK_M
    q = q_desc.load([row0 + m0, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = seqlen
    if CAUSAL:
        hi = m0 + BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    for n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
        k = k_desc.load([row0 + n, 0])
        v = v_desc.load([row0 + n, 0])
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if CAUSAL:
            offs_n = n + tl.arange(0, BLOCK_N)
            s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    offs_d = tl.arange(0, HEAD_DIM)
    rows = row0 + offs_m
    tl.store(o_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_i[:, None]).to(o_ptr.dtype.element_ty))
    tl.store(lse_ptr + rows, (m_i + tl.math.log2(l_i)) * 0.6931471805599453)
