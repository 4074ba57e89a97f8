"""Warp-specialized Hopper matmul with a fused epilogue, in Gluon (Triton 3.6's `triton.experimental.gluon`).

    C = act(A @ W^T + bias),  A (M, K) and W (N, K) row-major (W as nn.Linear stores it), C (M, N).

Why: in kernels.matmul_tma one program per SM runs each tile's epilogue after its K loop, so the
tensor cores idle through the activation math (a GELU is two special-function ops and ~15 FMA
instructions per element: +3-12 % over the plain product on an H100). Here the epilogue runs in
its own warps, beside the next tile's MMAs.

Partitions (12 warps: ptxas caps every region at the kernel's register limit, 65536 / threads,
whatever setmaxnreg grants later, and the m64n256 accumulator needs ~154 registers):
- MMA (the default partition, 8 warps = 2 warpgroups, a 128x256 tile): TMA loads STAGES - 1
  (tile, k) steps ahead of async wgmma, across tile boundaries; a stage is refilled once the wgmma
  that read it has retired. At a tile's end the fp32 accumulator is rounded to the output dtype
  (as torch's F.linear output before its activation) and written to a shared tile in 64-column
  chunks; the next tile's MMAs start at once.
- epilogue (4 warps): bias and activation in fp32 on each chunk, written back in place, then TMA
  stores; it hands the tile back once the stores have read it.
The K loop is nested in the tile loop, not flattened with the hand-off in a branch: ptxas waits
for every wgmma where a path that waited for the accumulator meets one that did not, and the
flattened form waits at each K step (12 % slower).

Rows, columns and the K tail past the tensors' ends: TMA reads zeros and clips stores. One
config (128x256x64, 3 stages: 144 KB of operands and the 64 KB output tile; ops.launch's WS_BLOCK_M
and WS_BLOCK_N repeat the tile, since ops.launch cannot import this module off Triton 3.6).
Launched by ops.launch for large forward products with an activation and no z
(`_runtime.compat.HAS_GLUON_HOPPER`; `_ws_worthwhile`).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .common import _activation, _grouped_tile

BLOCK_M, BLOCK_N, BLOCK_K, CHUNK_N, STAGES, GROUP_M = 128, 256, 64, 64, 3, 8
MMA_WARPS, EPILOGUE_WARPS, EPILOGUE_REGISTERS = 8, 4, 64


@gluon.jit
def _halves(x):
    """The left and right column halves of a register tile (a view: no data moves)."""
    rows: gl.constexpr = x.shape[0]
    cols: gl.constexpr = x.shape[1]
    return gl.split(gl.permute(gl.reshape(x, [rows, 2, cols // 2]), (0, 2, 1)))


@gluon.jit
def _issue_loads(a_desc, w_desc, a_bufs, w_bufs, ready, step, off_m, off_n, kk, valid):
    """TMA loads of A[off_m, kk] and W[off_n, kk] into stage step % STAGES, if valid."""
    BK: gl.constexpr = a_desc.block_type.shape[1]
    NSTAGES: gl.constexpr = a_bufs.type.shape[0]
    s = step % NSTAGES
    mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + w_desc.block_type.nbytes, pred=valid)
    tma.async_copy_global_to_shared(a_desc, [off_m, kk * BK], ready.index(s), a_bufs.index(s), pred=valid)
    tma.async_copy_global_to_shared(w_desc, [off_n, kk * BK], ready.index(s), w_bufs.index(s), pred=valid)


@gluon.jit
def _advance(kk, tile_id, off_m, off_n, k_tiles, num_pid_m, num_pid_n, BM: gl.constexpr, BN: gl.constexpr,
             GROUP: gl.constexpr):  # fmt: skip
    """The load walk's next (k block, tile); the tile's coordinates recomputed once per tile."""
    kk += 1
    if kk == k_tiles:
        kk = 0
        tile_id += gl.num_programs(0)
        pid_m, pid_n = _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP)
        off_m = pid_m * BM
        off_n = pid_n * BN
    return kk, tile_id, off_m, off_n


@gluon.jit
def _mma_partition(a_desc, w_desc, a_bufs, w_bufs, z_bufs, ready, z_ready, z_empty, M, N, K, GROUP: gl.constexpr,
                   num_warps: gl.constexpr):  # fmt: skip
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    NSTAGES: gl.constexpr = a_bufs.type.shape[0]
    CHUNKS: gl.constexpr = z_bufs.type.shape[0]
    gl.static_assert(CHUNKS == 4, "the output tile is handed over in four column chunks")
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BN, 16])  # fmt: skip
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    first = gl.program_id(0)
    my_tiles = gl.cdiv(num_pid_m * num_pid_n - first, gl.num_programs(0))
    total = my_tiles * k_tiles
    # The load walk runs NSTAGES - 1 steps ahead of the MMA walk.
    pid_m, pid_n = _grouped_tile(first, num_pid_m, num_pid_n, GROUP)
    ld_kk = first * 0
    ld_tile = first
    ld_m = pid_m * BM
    ld_n = pid_n * BN
    for p in gl.static_range(NSTAGES - 1):
        _issue_loads(a_desc, w_desc, a_bufs, w_bufs, ready, p, ld_m, ld_n, ld_kk, p < total)
        ld_kk, ld_tile, ld_m, ld_n = _advance(ld_kk, ld_tile, ld_m, ld_n, k_tiles, num_pid_m, num_pid_n, BM, BN, GROUP)
    acc = gl.zeros([BM, BN], gl.float32, layout)
    step = first * 0
    for t in range(my_tiles):
        for kk in range(k_tiles):
            s = step % NSTAGES
            mbarrier.wait(ready.index(s), (step // NSTAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc, use_acc=kk > 0,
                                is_async=True)  # fmt: skip
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            # The previous step's wgmma has retired: its stage takes the loads NSTAGES - 1 steps ahead.
            ahead = step + NSTAGES - 1
            _issue_loads(a_desc, w_desc, a_bufs, w_bufs, ready, ahead, ld_m, ld_n, ld_kk, ahead < total)
            ld_kk, ld_tile, ld_m, ld_n = _advance(ld_kk, ld_tile, ld_m, ld_n, k_tiles, num_pid_m, num_pid_n, BM, BN,
                                                  GROUP)  # fmt: skip
            step += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        z = acc.to(z_bufs.dtype)
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
def _epilogue_partition(c_desc, bias_ptr, z_bufs, z_ready, z_empty, M, N, BM: gl.constexpr, BN: gl.constexpr,
                        GROUP: gl.constexpr, ACTIVATION: gl.constexpr, HAS_BIAS: gl.constexpr):  # fmt: skip
    CHUNKS: gl.constexpr = z_bufs.type.shape[0]
    CHUNK: gl.constexpr = z_bufs.type.shape[2]
    SUB_M: gl.constexpr = 32  # rows per pass: 16 values a thread, a few registers each for the math
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    t = 0
    for tile_id in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP)
        mbarrier.wait(z_ready, t & 1)
        for j in gl.static_range(CHUNKS):
            chunk = z_bufs.index(j)
            cols = pid_n * BN + j * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, layout))
            if HAS_BIAS:
                bias = gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32)
            for r in gl.static_range(BM // SUB_M):
                part = chunk.slice(r * SUB_M, SUB_M, dim=0)
                z = part.load(layout).to(gl.float32)
                if HAS_BIAS:
                    z = z + bias[None, :]
                # kernels.common's formulas (a Triton function, callable from Gluon): 16-bit outputs, no PRECISE.
                part.store(_activation(z, ACTIVATION, False, False).to(chunk.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [pid_m * BM, pid_n * BN + j * CHUNK], chunk)
        tma.store_wait(0)
        mbarrier.arrive(z_empty, count=1)
        t += 1


@gluon.jit
def _matmul_ws_kernel(a_desc, w_desc, c_desc, bias_ptr, M, N, K, NSTAGES: gl.constexpr, GROUP: gl.constexpr,
                      ACTIVATION: gl.constexpr, HAS_BIAS: gl.constexpr, EPI_WARPS: gl.constexpr,
                      EPI_REGISTERS: gl.constexpr):  # fmt: skip
    num_warps: gl.constexpr = gl.num_warps()  # the compile option (not a parameter: Launch passes options)
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    CHUNK: gl.constexpr = c_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NSTAGES] + a_desc.block_type.shape, a_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [NSTAGES] + w_desc.block_type.shape, w_desc.layout)
    z_bufs = gl.allocate_shared_memory(c_desc.dtype, [BN // CHUNK, BM, CHUNK], c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NSTAGES, 1], mbarrier.MBarrierLayout())
    z_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    z_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NSTAGES):
        mbarrier.init(ready.index(i), count=1)
    mbarrier.init(z_ready, count=1)
    mbarrier.init(z_empty, count=1)
    gl.warp_specialize(
        [
            (
                _mma_partition,
                (a_desc, w_desc, a_bufs, w_bufs, z_bufs, ready, z_ready, z_empty, M, N, K, GROUP, num_warps),
            ),  # fmt: skip
            (
                _epilogue_partition,
                (c_desc, bias_ptr, z_bufs, z_ready, z_empty, M, N, BM, BN, GROUP, ACTIVATION, HAS_BIAS),
            ),  # fmt: skip
        ],
        [EPI_WARPS],
        [EPI_REGISTERS],
    )
