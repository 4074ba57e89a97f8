"""Persistent TMA matmul for Hopper (Triton >= 3.4): same contract as kernels.matmul, 16-bit operands.

    C[b] = act(A[b] @ B[b] + bias)

NUM_SMS * PROGRAMS_PER_SM programs each walk output tiles tile_id = pid, pid + programs, ... in
grouped order (common._grouped_tile); with two programs per SM, one's epilogue overlaps the
other's main loop (configs.tma_configs). Operands arrive through tensor descriptors: the TMA
engine copies each BLOCK tile into swizzled shared memory and wgmma reads it from there, so no
thread computes an address in the main loop. The program's (tile, k) steps are one loop,
flattened by hand (the tile's coordinates advance at its first step, its epilogue runs after
its last). So the pipeliner keeps the next tile's operand loads in flight while this tile's
epilogue runs, and the epilogue's TMA stores drain behind the next tile's math.
`tl.range(..., flatten=True)` over nested loops asked for the same, but Triton 3.6 and 3.9 left
it nested: their TTGIR kept the inner scf.for under a `tt.flatten` outer loop. Split-K work
items, whose K ranges differ, keep the nested loops. Out-of-bounds TMA reads return zeros (the
K tail needs no mask), and stores clip.

Epilogue in two halves of BLOCK_N / 2 columns when there is an activation or z to store, an fp32
output (split-K partials, or an fp32 parameter's gradient), or the config asks for it
(EPILOGUE_SPLIT; configs.splits_epilogue): the accumulator is split in registers (no data
movement), each half's bias, activation, casts and stores hold half the live registers of a
whole-tile epilogue (a 128x256 GELU epilogue with z saved spilled at 255 registers when done at
once: 246, no spills, in halves), the c and z descriptors' blocks are (BLOCK_M, BLOCK_N / 2),
and the staging buffer that every store of the tile reuses is half as large. A plain epilogue
otherwise stores its whole tile at once: one wait on the staging buffer per tile instead of two.

Layouts: a descriptor needs a unit stride in its last dim. A logical operand whose memory is
the transpose (e.g. B = W^T when W is an nn.Linear weight, or A = dZ^T in dW = dZ^T X) is read
through a descriptor of the transpose and transposed in the kernel (*_TRANS), which wgmma
consumes directly from shared memory. BATCHED uses 3-D descriptors (batch, rows, cols) so that
a tile never crosses into the next batch; the output tile gets its unit batch dim by a reshape,
which keeps the accumulator's register layout (an expand_dims there cost a layout conversion
through shared memory before every batched store).

HAS_BIAS, ACTIVATION, STORE_Z are kernels.matmul's, from the same helpers. UPCAST: interpreter
only (fp32 dot operands, rounded bf16 casts, no inline PTX).

GRAD_Z (the backward of an activation fused into the product that feeds it, e.g. an MLP's
dH = dY @ W2^T): the epilogue reads the tile of `saved` (z for the GELUs, the output for ReLU;
through z_desc, laid out like c; like a stored z, it makes the epilogue work in halves) and
stores dZ = acc * act'(saved) instead of acc, and with COLUMN_SUM each tile's fp32 column sums of
dZ (d(bias)) to row pid_m of colsum_ptr (num_pid_m, N), which the launcher adds up. This
replaces a separate elementwise pass (kernels.grad) that reads dH and saved and writes dZ: two
M x N memory passes fewer. Row-major, unbatched c only.

Split K (SPLIT_K > 1 with SPLIT_OUT; plain products only, configs.split_k): a problem with too few
output tiles to fill the GPU (a weight gradient, whose output is a weight and whose K is every
token) walks SPLIT_K work items per tile, each over a slice of K, storing fp32 partial sums that
the launcher adds up: no atomics, so the result does not depend on the order programs finish.
"""

import triton
import triton.language as tl

from .._runtime.compat import AUTOTUNE_TIMING
from .common import ACT_NONE, _activation, _activation_grad, _add_bias, _cast, _grouped_tile
from .configs import TMA_KEY, prune_tma_configs, tma_configs


@triton.jit
def _load_tile(desc, batch, off_0, off_1, BLOCK_0: tl.constexpr, BLOCK_1: tl.constexpr, TRANS: tl.constexpr,
               BATCHED: tl.constexpr):  # fmt: skip
    """The (BLOCK_0, BLOCK_1) tile at (off_0, off_1) of a matrix stored row-major, or transposed (TRANS)."""
    if TRANS:
        if BATCHED:
            tile = tl.reshape(desc.load([batch, off_1, off_0]), [BLOCK_1, BLOCK_0])
        else:
            tile = desc.load([off_1, off_0])
        tile = tl.trans(tile)
    else:
        if BATCHED:
            tile = tl.reshape(desc.load([batch, off_0, off_1]), [BLOCK_0, BLOCK_1])
        else:
            tile = desc.load([off_0, off_1])
    return tile


@triton.jit
def _store_tile(desc, batch, off_0, off_1, tile, TRANS: tl.constexpr, BATCHED: tl.constexpr):
    """Store `tile` at (off_0, off_1) of a matrix stored row-major, or transposed (TRANS)."""
    if TRANS:
        tile = tl.trans(tile)
        off_0, off_1 = off_1, off_0
    if BATCHED:
        desc.store([batch, off_0, off_1], tl.reshape(tile, [1, tile.shape[0], tile.shape[1]]))
    else:
        desc.store([off_0, off_1], tile)


@triton.jit
def _epilogue(acc, c_desc, z_desc, bias_ptr, stride_bias, colsum_ptr, batch, c_batch, off_m, off_n, N,
              HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_Z: tl.constexpr, GRAD_Z: tl.constexpr,
              COLUMN_SUM: tl.constexpr, C_TRANS: tl.constexpr, BATCHED: tl.constexpr, C_BATCHED: tl.constexpr,
              UPCAST: tl.constexpr):  # fmt: skip
    """Bias, activation, casts and stores of the (BLOCK_M, acc.shape[1]) output tile at (off_m, off_n)
    (c's batch index c_batch: with SPLIT_OUT, a split's partial-sum slice); with GRAD_Z the
    activation's backward instead (module docstring).

    z is stored before the activation is computed, so that the activation's math overlaps the
    TMA engine's read of the staging buffer (which the next store reuses).
    """
    cols = off_n + tl.arange(0, acc.shape[1])
    if GRAD_Z:
        # Rows past M read zeros, and their acc is zero (A's rows there are zeros): dZ = 0 there.
        saved = _load_tile(z_desc, batch, off_m, off_n, acc.shape[0], acc.shape[1], C_TRANS, BATCHED)
        y = _activation_grad(acc, saved.to(tl.float32), ACTIVATION, UPCAST, False)  # 16-bit results only
        if COLUMN_SUM:
            tl.store(colsum_ptr + (off_m // acc.shape[0]) * N + cols, tl.sum(y, axis=0), mask=cols < N)
    else:
        z = _add_bias(acc, bias_ptr, stride_bias, cols, N, HAS_BIAS)
        if STORE_Z:
            _store_tile(z_desc, batch, off_m, off_n, _cast(z, z_desc.dtype, UPCAST), C_TRANS, BATCHED)
        y = _activation(z, ACTIVATION, UPCAST, False)  # 16-bit results only
    _store_tile(c_desc, c_batch, off_m, off_n, _cast(y, c_desc.dtype, UPCAST), C_TRANS, C_BATCHED)


@triton.jit
def _tile_epilogue(acc, c_desc, z_desc, bias_ptr, stride_bias, colsum_ptr, batch, c_batch, off_m, off_n, N,
                   HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_Z: tl.constexpr, GRAD_Z: tl.constexpr,
                   COLUMN_SUM: tl.constexpr, C_TRANS: tl.constexpr, BATCHED: tl.constexpr, C_BATCHED: tl.constexpr,
                   UPCAST: tl.constexpr, EPILOGUE_SPLIT: tl.constexpr):  # fmt: skip
    """A finished (BLOCK_M, BLOCK_N) tile's epilogue, whole or in two halves of BLOCK_N / 2 columns
    (configs.splits_epilogue; the module docstring)."""
    BLOCK_M: tl.constexpr = acc.shape[0]
    BLOCK_N: tl.constexpr = acc.shape[1]
    if EPILOGUE_SPLIT or ACTIVATION != ACT_NONE or STORE_Z or GRAD_Z or c_desc.dtype == tl.float32:
        acc_0, acc_1 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
        _epilogue(acc_0, c_desc, z_desc, bias_ptr, stride_bias, colsum_ptr, batch, c_batch, off_m, off_n, N,
                  HAS_BIAS, ACTIVATION, STORE_Z, GRAD_Z, COLUMN_SUM, C_TRANS, BATCHED, C_BATCHED, UPCAST)  # fmt: skip
        _epilogue(acc_1, c_desc, z_desc, bias_ptr, stride_bias, colsum_ptr, batch, c_batch, off_m,
                  off_n + BLOCK_N // 2, N, HAS_BIAS, ACTIVATION, STORE_Z, GRAD_Z, COLUMN_SUM, C_TRANS, BATCHED,
                  C_BATCHED, UPCAST)  # fmt: skip
    else:
        _epilogue(acc, c_desc, z_desc, bias_ptr, stride_bias, colsum_ptr, batch, c_batch, off_m, off_n, N,
                  HAS_BIAS, ACTIVATION, STORE_Z, GRAD_Z, COLUMN_SUM, C_TRANS, BATCHED, C_BATCHED, UPCAST)  # fmt: skip


@triton.jit
def _dot_step(a, b, acc, UPCAST: tl.constexpr):
    """acc + a @ b; the interpreter (UPCAST) multiplies fp32 copies."""
    if UPCAST:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        acc = tl.dot(a, b, acc)
    return acc


# The autotuner holds the candidate configs and their prune rule. ops.launch times the candidates
# itself (ops.tuning: interleaved rounds, robust to the GPU's clock drift) and launches the JIT
# function directly; the autotuner times them only where this kernel is called through it.
@triton.autotune(
    configs=tma_configs(), key=TMA_KEY, prune_configs_by={"early_config_prune": prune_tma_configs}, **AUTOTUNE_TIMING
)
# Sizes only reach the descriptors' bounds and the tile walk: unspecialized, one compile serves every shape.
@triton.jit(do_not_specialize=["M", "N", "K", "BATCH", "SPLIT_K"])
def _matmul_tma_kernel(
    a_desc,
    b_desc,
    c_desc,
    z_desc,
    bias_ptr,
    stride_bias,
    colsum_ptr,
    M,
    N,
    K,
    BATCH,
    SPLIT_K,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    STORE_Z: tl.constexpr,
    GRAD_Z: tl.constexpr,
    COLUMN_SUM: tl.constexpr,
    A_TRANS: tl.constexpr,
    B_TRANS: tl.constexpr,
    C_TRANS: tl.constexpr,
    BATCHED: tl.constexpr,
    SPLIT_OUT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_SMS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PROGRAMS_PER_SM: tl.constexpr,
    EPILOGUE_SPLIT: tl.constexpr,
):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_batch = num_pid_m * num_pid_n
    num_tiles = BATCH * tiles_per_batch
    k_tiles = tl.cdiv(K, BLOCK_K)
    # Split K (SPLIT_K > 1, with SPLIT_OUT): each output tile is SPLIT_K work items, one per slice of
    # the K steps, whose partial sums go to slice `split` of c, an fp32 (SPLIT_K x BATCH, M, N)
    # workspace that the launcher sums. Split-major order: the programs running side by side work
    # on the same K slice of neighbouring tiles, sharing operand tiles in L2 as without a split.
    k_steps = tl.cdiv(k_tiles, SPLIT_K)
    if SPLIT_OUT:
        for work in tl.range(tl.program_id(0), num_tiles * SPLIT_K, NUM_SMS * PROGRAMS_PER_SM):
            split = work // num_tiles
            tile_id = work % num_tiles
            batch = tile_id // tiles_per_batch
            pid_m, pid_n = _grouped_tile(tile_id % tiles_per_batch, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            k_first = split * k_steps
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_first, tl.minimum(k_first + k_steps, k_tiles)):
                a = _load_tile(a_desc, batch, off_m, ki * BLOCK_K, BLOCK_M, BLOCK_K, A_TRANS, BATCHED)
                b = _load_tile(b_desc, batch, ki * BLOCK_K, off_n, BLOCK_K, BLOCK_N, B_TRANS, BATCHED)
                acc = _dot_step(a, b, acc, UPCAST)
            _tile_epilogue(acc, c_desc, z_desc, bias_ptr, stride_bias, colsum_ptr, batch, split * BATCH + batch, off_m,
                           off_n, N, HAS_BIAS, ACTIVATION, STORE_Z, GRAD_Z, COLUMN_SUM, C_TRANS, BATCHED, True, UPCAST,
                           EPILOGUE_SPLIT)  # fmt: skip
    else:
        # One loop over this program's (tile, k) steps, flattened by hand: the pipeliner then loads
        # the next tile's operands while this tile's epilogue runs (the module docstring). Against
        # nested loops (H100, Triton 3.6, configs pinned) the fastest config of each product and
        # epilogue is 1-6.5 % faster.
        programs = NUM_SMS * PROGRAMS_PER_SM
        pid = tl.program_id(0)
        zero = pid * 0  # i32 tensors: the loop and the branch below carry them
        tile_id = pid - programs
        ki = zero - 1
        off_m = zero
        off_n = zero
        batch = zero
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, tl.cdiv(num_tiles - pid, programs) * k_tiles):
            ki = tl.where(ki == k_tiles - 1, 0, ki + 1)
            if ki == 0:
                tile_id += programs
                batch = tile_id // tiles_per_batch
                pid_m, pid_n = _grouped_tile(tile_id % tiles_per_batch, num_pid_m, num_pid_n, GROUP_M)
                off_m = pid_m * BLOCK_M
                off_n = pid_n * BLOCK_N
            a = _load_tile(a_desc, batch, off_m, ki * BLOCK_K, BLOCK_M, BLOCK_K, A_TRANS, BATCHED)
            b = _load_tile(b_desc, batch, ki * BLOCK_K, off_n, BLOCK_K, BLOCK_N, B_TRANS, BATCHED)
            acc = _dot_step(a, b, acc, UPCAST)
            if ki == k_tiles - 1:
                _tile_epilogue(acc, c_desc, z_desc, bias_ptr, stride_bias, colsum_ptr, batch, batch, off_m, off_n, N,
                               HAS_BIAS, ACTIVATION, STORE_Z, GRAD_Z, COLUMN_SUM, C_TRANS, BATCHED, BATCHED, UPCAST,
                               EPILOGUE_SPLIT)  # fmt: skip
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
