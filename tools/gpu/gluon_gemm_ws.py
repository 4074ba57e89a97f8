"""Lab (session 12): a warp-specialized persistent Hopper matmul in Gluon, C = act(A @ W^T + bias).

Not part of any package: `tools/gpu/gemm_gluon_lab.py` checks and times it (runs 101-104, NOTES.md).
Needs Triton >= 3.6 (`triton.experimental.gluon`) and an sm_90 GPU.

A (M, K) and W (N, K) row-major bf16 (W as nn.Linear stores it), C (M, N) bf16. Two partitions
(12 warps: ptxas caps every region at the kernel's register limit, 65536 / threads, and a
m64n256 accumulator needs ~154, so 16 warps (128 each) cannot hold it):
- MMA (the default partition, 8 warps = 2 warpgroups, a 128x256 tile): TMA loads STAGES - 1
  steps ahead of async wgmma down K, over the program's flattened (tile, k) steps; a stage is
  refilled once the wgmma that read it has retired. At a tile's end the fp32 accumulator is
  rounded to bf16 and written to a shared-memory tile in 64-column chunks, and the next tile's
  MMAs start at once;
- epilogue (4 warps): bias and activation on the tile (fp32 math), written back in place, then
  TMA stores; it hands the tile back when its stores have read it.
So the bias and activation run beside the next tile's MMAs instead of after them.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@gluon.jit
def _tile(tile_id, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """(pid_m, pid_n) of a tile in grouped order: GROUP_M row blocks sweep the columns together."""
    group = GROUP_M * num_pid_n
    first_m = (tile_id // group) * GROUP_M
    size_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    in_group = tile_id % group
    return first_m + in_group % size_m, in_group // size_m


@gluon.jit
def _ex2(x):
    return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _rcp(x):
    return gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _gelu(z):
    """z Phi(z), Phi through the Mills ratio as fused-gemm's kernels.common._normal_pdf_cdf (two
    special-function ops and ~15 FMA-pipe instructions per element; error < 5.1e-9 on Phi)."""
    t = _rcp(1.0 + 0.275 * gl.abs(z))
    pdf = _ex2(z * z * -0.7213475204444817 - 1.3257480647361593)
    poly = -0.2879068620
    poly = poly * t + 1.132991917
    poly = poly * t - 0.8296765249
    poly = poly * t + 0.8370437550
    poly = poly * t + 0.1055578391
    poly = poly * t + 0.2953040247
    tail = pdf * t * poly
    return z * gl.where(z >= 0.0, 1.0 - tail, tail)


@gluon.jit
def _epilogue(c_desc, bias_ptr, z_bufs, z_ready, z_empty, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              GROUP_M: gl.constexpr, ACTIVATION: gl.constexpr, HAS_BIAS: gl.constexpr,
              HANDOFF: gl.constexpr):  # fmt: skip
    CHUNKS: gl.constexpr = z_bufs.type.shape[0]
    CHUNK_N: gl.constexpr = z_bufs.type.shape[2]
    SUB_M: gl.constexpr = 32
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    t = 0
    for tile_id in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        mbarrier.wait(z_ready, t & 1)
        for j in gl.static_range(CHUNKS if HANDOFF else 0):  # not HANDOFF: hand the tile back at once (timing only)
            chunk = z_bufs.index(j)
            if ACTIVATION or HAS_BIAS:
                cols = pid_n * BLOCK_N + j * CHUNK_N + gl.arange(0, CHUNK_N, layout=gl.SliceLayout(0, layout))
                if HAS_BIAS:
                    bias = gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32)
                for r in gl.static_range(BLOCK_M // SUB_M):
                    part = chunk.slice(r * SUB_M, SUB_M, dim=0)
                    z = part.load(layout).to(gl.float32)
                    if HAS_BIAS:
                        z = z + bias[None, :]
                    if ACTIVATION:
                        z = _gelu(z)
                    part.store(z.to(gl.bfloat16))
                fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N + j * CHUNK_N], chunk)
        tma.store_wait(0)
        mbarrier.arrive(z_empty, count=1)
        t += 1


@gluon.jit
def _halves(x):
    """The left and right column halves of a register tile (a view: no data moves)."""
    rows: gl.constexpr = x.shape[0]
    cols: gl.constexpr = x.shape[1]
    return gl.split(gl.permute(gl.reshape(x, [rows, 2, cols // 2]), (0, 2, 1)))


@gluon.jit
def _issue_loads(a_desc, w_desc, a_bufs, w_bufs, ready, step, off_m, off_n, kk, valid):
    """TMA loads of A[off_m, kk] and W[off_n, kk] into stage step % STAGES, if valid."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    s = step % STAGES
    mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + w_desc.block_type.nbytes, pred=valid)
    tma.async_copy_global_to_shared(a_desc, [off_m, kk * BLOCK_K], ready.index(s), a_bufs.index(s), pred=valid)
    tma.async_copy_global_to_shared(w_desc, [off_n, kk * BLOCK_K], ready.index(s), w_bufs.index(s), pred=valid)


@gluon.jit
def _advance(kk, tile_id, off_m, off_n, k_tiles, num_pid_m, num_pid_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             GROUP_M: gl.constexpr):  # fmt: skip
    """The next (k block, tile) of the program's flattened walk; coordinates recomputed once per tile."""
    kk += 1
    if kk == k_tiles:
        kk = 0
        tile_id += gl.num_programs(0)
        pid_m, pid_n = _tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
    return kk, tile_id, off_m, off_n


@gluon.jit
def _mma(a_desc, w_desc, a_bufs, w_bufs, z_bufs, ready, z_ready, z_empty, M, N, K, GROUP_M: gl.constexpr,
         HANDOFF: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    CHUNKS: gl.constexpr = z_bufs.type.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    first = gl.program_id(0)
    my_tiles = gl.cdiv(num_pid_m * num_pid_n - first, gl.num_programs(0))
    total = my_tiles * k_tiles
    # The load walk runs STAGES - 1 steps ahead of the MMA walk.
    pid_m, pid_n = _tile(first, num_pid_m, num_pid_n, GROUP_M)
    ld_kk = first * 0
    ld_tile = first
    ld_m = pid_m * BLOCK_M
    ld_n = pid_n * BLOCK_N
    for p in gl.static_range(STAGES - 1):
        _issue_loads(a_desc, w_desc, a_bufs, w_bufs, ready, p, ld_m, ld_n, ld_kk, p < total)
        ld_kk, ld_tile, ld_m, ld_n = _advance(ld_kk, ld_tile, ld_m, ld_n, k_tiles, num_pid_m, num_pid_n, BLOCK_M,
                                              BLOCK_N, GROUP_M)  # fmt: skip
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout)
    step = first * 0
    # Nested loops, not one flattened (tile, k) loop with the hand-off in a branch: ptxas waits for
    # every wgmma where a path that waited for the accumulator merges with one that did not, so
    # the flattened form waited each step (run 111). The load walk runs ahead across tiles anyway.
    for t in range(my_tiles):
        for kk in range(k_tiles):
            s = step % STAGES
            mbarrier.wait(ready.index(s), (step // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc, use_acc=kk > 0,
                                is_async=True)  # fmt: skip
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            # The previous step's wgmma has retired: its stage takes the loads STAGES - 1 steps ahead.
            ahead = step + STAGES - 1
            _issue_loads(a_desc, w_desc, a_bufs, w_bufs, ready, ahead, ld_m, ld_n, ld_kk, ahead < total)
            ld_kk, ld_tile, ld_m, ld_n = _advance(ld_kk, ld_tile, ld_m, ld_n, k_tiles, num_pid_m, num_pid_n, BLOCK_M,
                                                  BLOCK_N, GROUP_M)  # fmt: skip
            step += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        z = acc.to(gl.bfloat16)
        gl.static_assert(CHUNKS == 4, "the lab kernel splits the tile in four column chunks")
        z_lo, z_hi = _halves(z)
        z0, z1 = _halves(z_lo)
        z2, z3 = _halves(z_hi)
        mbarrier.wait(z_empty, (t & 1) ^ 1)
        z_bufs.index(0).store(z0)
        z_bufs.index(1).store(z1)
        z_bufs.index(2).store(z2)
        z_bufs.index(3).store(z3)
        fence_async_shared()
        mbarrier.arrive(z_ready, count=1)


@gluon.jit
def matmul_ws_kernel(a_desc, w_desc, c_desc, bias_ptr, M, N, K, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                     ACTIVATION: gl.constexpr, HAS_BIAS: gl.constexpr, EPILOGUE_REGS: gl.constexpr,
                     HANDOFF: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    CHUNK_N: gl.constexpr = c_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    z_bufs = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_N // CHUNK_N, BLOCK_M, CHUNK_N], c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    z_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    z_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    mbarrier.init(z_ready, count=1)
    mbarrier.init(z_empty, count=1)
    gl.warp_specialize(
        [
            (
                _mma,
                (a_desc, w_desc, a_bufs, w_bufs, z_bufs, ready, z_ready, z_empty, M, N, K, GROUP_M, HANDOFF, num_warps),
            ),  # fmt: skip
            (
                _epilogue,
                (
                    c_desc,
                    bias_ptr,
                    z_bufs,
                    z_ready,
                    z_empty,
                    M,
                    N,
                    BLOCK_M,
                    BLOCK_N,
                    GROUP_M,
                    ACTIVATION,
                    HAS_BIAS,
                    HANDOFF,
                ),
            ),  # fmt: skip
        ],
        [4],
        [EPILOGUE_REGS],
    )


def matmul_ws(a, w, bias=None, gelu=False, block_m=128, block_n=256, block_k=64, chunk_n=64, stages=3, group_m=8,
              num_sms=None, epilogue_regs=64, handoff=True, out=None):  # fmt: skip
    """C = act(a @ w^T + bias), bf16; a (M, K), w (N, K), both row-major."""
    m, k = a.shape
    n = w.shape[0]
    c = out if out is not None else a.new_empty(m, n)
    a_desc = TensorDescriptor.from_tensor(
        a, [block_m, block_k], gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    )
    w_desc = TensorDescriptor.from_tensor(
        w, [block_n, block_k], gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.bfloat16)
    )
    c_desc = TensorDescriptor.from_tensor(
        c, [block_m, chunk_n], gl.NVMMASharedLayout.get_default_for([block_m, chunk_n], gl.bfloat16)
    )
    if num_sms is None:
        import torch

        num_sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    grid = (min(num_sms, tiles),)
    matmul_ws_kernel[grid](a_desc, w_desc, c_desc, bias if bias is not None else c, m, n, k, stages, group_m, gelu,
                           bias is not None, epilogue_regs, handoff, num_warps=8)  # fmt: skip
    return c
