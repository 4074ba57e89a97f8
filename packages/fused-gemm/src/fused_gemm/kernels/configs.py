"""Autotune configs of the matmul kernels, sized for the H100 (and fine on the A100), and the
launch constants of the backward's elementwise pass.

H100 facts that shape them: 132 SMs, 227 KB of shared memory per block, wgmma works on 64-row
warpgroup slices, so 8 warps cover a 128-row tile, and 128x256 is the largest tile whose fp32
accumulator (128 registers per thread at 8 warps) leaves room for the epilogue.

Shared memory, as compiled for sm_90 (`metadata.shared` under Triton 3.9; Triton 3.6's within
2 KB), is what the prune models, so that no candidate is compiled only to fail its
launch: operand stages, plus for the TMA kernel one output staging buffer that every store of a
tile reuses: a whole tile for a plain or biased epilogue (128x256x64, three stages: 3 x 48 +
64 = 208 KB), half a tile when an activation or the saved z makes the epilogue work in two
halves (176 KB). 3-D (bmm) stores stage like 2-D ones. The portable kernel stages only its
operands (144-180 KB at most in bf16); fp32 operands double that.

Under the interpreter the autotuner cannot time anything: the TMA kernel gets one small config;
the portable kernel two, of which the launcher picks one by the problem's size
(interpreter_config), launching without the autotuner.
"""

from __future__ import annotations

import functools
from typing import Dict, List

import triton

from .._runtime.compat import INTERPRETING, max_shared_memory
from .._runtime.tuning import SKINNY_ROWS, configs_for_rows

# Autotune keys: the problem size and every constexpr that changes the work per tile.
PORTABLE_KEY = ["M", "N", "K", "HAS_BIAS", "ACTIVATION", "STORE_Z", "ALLOW_TF32"]
TMA_KEY = [
    "M", "N", "K", "BATCH", "SPLIT_K", "HAS_BIAS", "ACTIVATION", "STORE_Z", "GRAD_Z", "A_TRANS", "B_TRANS", "C_TRANS"
]  # fmt: skip

# Output elements from which 128x128 tiles fill 132 SMs four times over: only large tiles compete.
LARGE_PROBLEM = 4 * 132 * 128 * 128

# Under the interpreter every tile step is tens of numpy calls whatever the tile's size, so the
# tile follows the problem: 16-wide (the test suites' shapes, up to INTERPRETER_SMALL_DIM in M and
# N, span several tiles in every dim, so the edges are exercised), 64-wide beyond (a model run in
# the interpreter: ~50x fewer tile steps than at 16).
INTERPRETER_TILE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}
INTERPRETER_LARGE_TILE = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 2}
INTERPRETER_SMALL_DIM = 96

# The backward's elementwise pass (kernels.grad): 32 x 256 tiles over 8 warps (16-byte vectors,
# four per thread and tensor); when interpreting, 8 x 16 tiles for the test suites' shapes (several
# per dim), 32 x 64 beyond.
GRAD_TILE = {"BLOCK_M": 32, "BLOCK_N": 256, "num_warps": 8}
INTERPRETER_GRAD_TILES = ({"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 1}, {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 1})
# Programs of the elementwise pass per SM: enough to keep ~4 x 32 KB of loads in flight on each.
GRAD_PROGRAMS_PER_SM = 8


def grad_tile(m: int, n: int, interpreting: bool = INTERPRETING) -> Dict:
    """The elementwise pass's tile (BLOCK_M, BLOCK_N, num_warps) for an (m, n) problem."""
    if interpreting:
        return INTERPRETER_GRAD_TILES[max(m, n) > INTERPRETER_SMALL_DIM]
    return GRAD_TILE


def grad_rows(batch: int, m: int, n: int, sms: int, tile: Dict) -> int:
    """Rows per program of the elementwise pass: as many as keep GRAD_PROGRAMS_PER_SM programs per
    SM busy (fewer partial column sums to add up afterwards), a multiple of BLOCK_M."""
    block_m = tile["BLOCK_M"]
    column_slices = -(-n // tile["BLOCK_N"])
    row_programs = max(1, sms * GRAD_PROGRAMS_PER_SM // max(column_slices, 1))
    rows = -(-batch * m // row_programs)
    return max(block_m, -(-rows // block_m) * block_m)


def interpreter_config(configs: List[triton.Config], m: int, n: int) -> triton.Config:
    """The portable kernel's config under the interpreter (its list there: the small and the large tile)."""
    return configs[max(m, n) > INTERPRETER_SMALL_DIM]


def EVEN_K_HEURISTIC(args: Dict) -> bool:
    return args["K"] % args["BLOCK_K"] == 0


# Row-tiles per group of the tile order (kernels.common._grouped_tile). The persistent TMA kernel
# takes 4: over a 410M GPT layer's twelve products (H100, Triton 3.6, each config alone) 4 beats 8
# by 1-2 % on most of them. On an H200 (plain forwards, CUDA-graph timing, best config of each) 4 is
# faster on 16384x2048x8192 and 16384x8192x2048 (0.773 / 0.781 ms against
# 0.824 / 0.837), slower on 16384x2048x6144 (0.626 against 0.596), level (within 3 %) on the 410M
# layer's qkv, fc1, fc2 and proj. The portable kernel keeps 8.
PORTABLE_GROUP_M = 8
TMA_GROUP_M = 4


def _config(block_m, block_n, block_k, num_warps, num_stages, pre_hook=None, group_m=PORTABLE_GROUP_M,
            **extra) -> triton.Config:  # fmt: skip
    tile = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": group_m, **extra}
    return triton.Config(tile, num_warps=num_warps, num_stages=num_stages, pre_hook=pre_hook)


def portable_configs(interpreting: bool = INTERPRETING) -> List[triton.Config]:
    """Pointer-based kernel: large tiles for large problems, smaller ones for thin or fp32 problems."""
    if interpreting:
        return [
            triton.Config(dict(tile), num_warps=1, num_stages=1) for tile in (INTERPRETER_TILE, INTERPRETER_LARGE_TILE)
        ]
    return [
        _config(128, 256, 64, 8, 3),
        _config(256, 128, 64, 8, 3),
        _config(128, 256, 32, 8, 4),
        _config(128, 128, 64, 8, 4),
        _config(128, 128, 32, 4, 4),
        _config(64, 128, 32, 4, 4),
        _config(128, 64, 32, 4, 4),
        _config(64, 64, 32, 4, 3),
        *skinny_configs(),
        _config(32, 64, 32, 4, 3),  # last: the smallest, which the GPU tests pin
    ]


# Products of at most SKINNY_ROWS rows of 16-bit operands (_runtime.tuning.skinny_problem: a decode
# step's tokens) are bound by the weight's bytes. Their tiles are SKINNY_ROWS tall, narrow (so that
# even a 2048-wide output spreads over every SM) and deep in K (each stage streams 8-32 KB of the
# weight, three to five in flight per program). Measured at the 1.4B model's decode (H100, one row,
# weights partly in L2): the 32x64x32 tile these problems had before read the qkv, output and head
# weights at 1.83, 0.65 and 2.35 TB/s, cuBLAS at 2.99, 1.58 and 2.65.
def skinny_configs() -> List[triton.Config]:
    return [
        _config(SKINNY_ROWS, 16, 256, 4, 4),
        _config(SKINNY_ROWS, 16, 512, 4, 4),
        _config(SKINNY_ROWS, 32, 256, 4, 4),
        _config(SKINNY_ROWS, 32, 512, 4, 3),
        _config(SKINNY_ROWS, 32, 128, 4, 5),
        _config(SKINNY_ROWS, 64, 128, 4, 4),
    ]


def splits_epilogue(meta: Dict, activation, store_z, fp32_out=False) -> bool:
    """The TMA kernel's epilogue works in two halves of BLOCK_N / 2 columns (kernels.matmul_tma):
    with an activation or z, for an fp32 output (split-K partials, or a gradient written in an fp32
    parameter's dtype: a whole fp32 tile's staging buffer would not leave room for three 128x256
    operand stages), or where the config asks for it (EPILOGUE_SPLIT)."""
    return bool(meta["EPILOGUE_SPLIT"] or activation or store_z or fp32_out)


def tma_block_shapes(meta: Dict, a_trans, b_trans, c_trans, batched, halves, split_out=False):
    """Block shapes of the a, b and c (and z) descriptors for a config's tile (`meta`): transposed
    operands are described in memory order; 3-D (batched) ones lead with a unit batch dim, and so
    does c when it is a split-K workspace (`split_out`); a split epilogue (`halves`) stores halves
    of BLOCK_N columns."""
    block_m, block_n, block_k = meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]
    lead = [1] if batched else []
    c_lead = [1] if batched or split_out else []
    c_cols = block_n // 2 if halves else block_n
    return (
        lead + ([block_k, block_m] if a_trans else [block_m, block_k]),
        lead + ([block_n, block_k] if b_trans else [block_k, block_n]),
        c_lead + ([c_cols, block_m] if c_trans else [block_m, c_cols]),
    )


def set_tma_block_shapes(nargs: Dict) -> None:
    """Autotune pre-hook: give each tensor descriptor the block shape of the config being run."""
    halves = splits_epilogue(
        nargs, nargs["ACTIVATION"], nargs["STORE_Z"] or nargs["GRAD_Z"], nargs["c_desc"].base.element_size() == 4
    )
    a_block, b_block, c_block = tma_block_shapes(
        nargs, nargs["A_TRANS"], nargs["B_TRANS"], nargs["C_TRANS"], nargs["BATCHED"], halves, nargs["SPLIT_OUT"]
    )
    nargs["a_desc"].block_shape = a_block
    nargs["b_desc"].block_shape = b_block
    nargs["c_desc"].block_shape = c_block
    if nargs["z_desc"] is not None:
        nargs["z_desc"].block_shape = c_block


def _tma_config(block_m, block_n, block_k, num_warps, num_stages, programs=1, split=False) -> triton.Config:
    return _config(block_m, block_n, block_k, num_warps, num_stages, set_tma_block_shapes, TMA_GROUP_M,
                   PROGRAMS_PER_SM=programs, EPILOGUE_SPLIT=split)  # fmt: skip


def tma_configs(interpreting: bool = INTERPRETING) -> List[triton.Config]:
    """Persistent TMA kernel (Hopper): wgmma-sized tiles, 2-4 stages, one or two programs per SM.

    One program per SM with 8 warps (two warpgroups on one tile) is the plain matmul's shape;
    EPILOGUE_SPLIT stages the output in halves (kernels.matmul_tma) even without an activation,
    which frees 32 KB for a fourth 128x256x64 operand stage (224 KB): deeper prefetch for long K
    loops, for one more wait on the staging buffer per tile. A GELU epilogue (~17 instructions
    and two special-function ops per element) leaves the tensor cores idle while it runs; with
    two 4-warp programs per SM (half the shared memory each) one program's epilogue overlaps the
    other's main loop, as a ping-pong schedule.

    Not among the candidates: Triton's automatic warp specialization of a nested (tile, k) loop
    (compiles at 8 warps only). On an H100 (Triton 3.6), across a 410M GPT step's twelve products,
    the autotuner's picks with it sum to the same matmul time (43.52 against 43.67 ms), and they
    are slower on the 16384x8192x2048 forward (0.82 vs 0.72 ms: timing noise chose them).
    """
    if interpreting:
        tile = dict(INTERPRETER_TILE, PROGRAMS_PER_SM=1, EPILOGUE_SPLIT=False)
        return [triton.Config(tile, num_warps=4, num_stages=1, pre_hook=set_tma_block_shapes)]
    return [
        _tma_config(128, 256, 64, 8, 3),
        _tma_config(128, 256, 64, 8, 4, split=True),
        _tma_config(256, 128, 64, 8, 3),
        _tma_config(128, 128, 64, 8, 4),
        _tma_config(128, 128, 64, 4, 2, programs=2),
        _tma_config(64, 256, 64, 4, 2, programs=2),
        _tma_config(128, 128, 64, 4, 3, programs=2, split=True),
        _tma_config(128, 128, 64, 8, 3, programs=2, split=True),
        _tma_config(128, 128, 64, 4, 3),
        _tma_config(64, 128, 64, 4, 4),  # last: the smallest, which the GPU tests pin (fits every variant)
    ]


def _portable_smem(kw: Dict, num_stages: int, element_size: int) -> int:
    """Operand stages (as compiled for sm_90)."""
    return num_stages * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * element_size


def _tma_smem(kw: Dict, num_stages: int, element_size: int, half_tile_epilogue: bool, out_size: int = 0) -> int:
    """Operand stages and the epilogue's staging buffer: the output tile, or half of it, in the
    output's element size (out_size; default the operands', 4 for a split-K workspace). A fused
    activation gradient's load of the saved tile reuses the staging buffer (as compiled: the
    same shared memory as a GELU forward that stores z)."""
    staging = kw["BLOCK_M"] * kw["BLOCK_N"] * (out_size or element_size) // (2 if half_tile_epilogue else 1)
    return _portable_smem(kw, num_stages, element_size) + staging


def _portable_large_candidate(config: triton.Config) -> bool:
    """For a problem that fills the GPU several times over: tiles of at least 128x128 and 8 warps."""
    kw = config.kwargs
    return kw["BLOCK_M"] * kw["BLOCK_N"] >= 128 * 128 and config.num_warps == 8


def _tma_large_candidate(config: triton.Config) -> bool:
    """For a problem that fills the GPU several times over: the cooperative 128x256 / 256x128 tiles
    (8 warps, one program per SM, 64 deep) and the two ping-pong configs (two 4-warp programs per
    SM). Each candidate costs a compile per fused variant on first use; these are the ones that
    can win there."""
    kw = config.kwargs
    if kw["PROGRAMS_PER_SM"] == 2:
        return True
    return kw["BLOCK_M"] * kw["BLOCK_N"] >= 128 * 256 and config.num_warps == 8


def _sized_for(config: triton.Config, m: int, n: int, batch: int, smallest_m: int, smallest_n: int, large) -> bool:
    """The tile suits the problem: not much larger than it (a 1000-row problem may use 128-row tiles,
    a 7-row one not), and one of the `large` candidates when 128x128 tiles fill the GPU four times
    over (smaller tiles only add operand traffic there)."""
    kw = config.kwargs
    if kw["BLOCK_M"] > max(triton.next_power_of_2(m), smallest_m):
        return False
    if kw["BLOCK_N"] > max(triton.next_power_of_2(n), smallest_n):
        return False
    return batch * m * n < LARGE_PROBLEM or large(config)


def _fits(config: triton.Config, smem_bytes: int, budget: int) -> bool:
    """`budget` is one block's opt-in maximum; the SM has 1 KB more, and each resident block reserves 1 KB."""
    per_sm = config.kwargs.get("PROGRAMS_PER_SM", 1)
    return per_sm * (smem_bytes + 1024) <= budget + 1024


def _prune(configs: List[triton.Config], m: int, n: int, batch: int, smem_bytes, budget: int, large):
    """Configs whose shared memory fits `budget` and whose tile suits the problem size."""
    smallest_m = min(c.kwargs["BLOCK_M"] for c in configs)
    smallest_n = min(c.kwargs["BLOCK_N"] for c in configs)
    kept = [
        c
        for c in configs
        if _fits(c, smem_bytes(c), budget) and _sized_for(c, m, n, batch, smallest_m, smallest_n, large)
    ]
    if kept:
        return kept
    return [min(configs, key=smem_bytes)]


def portable_candidates(configs, m: int, n: int, element_size: int, device) -> List[triton.Config]:
    """The portable kernel's configs worth timing for an (m, n) output of `element_size` operands
    (the batch is not counted: it is in the grid, not an argument of the kernel): the skinny tiles
    for a skinny problem, the others for the rest."""
    return _prune(
        configs_for_rows(configs, m, element_size), m, n, 1,
        lambda c: _portable_smem(c.kwargs, c.num_stages, element_size), max_shared_memory(device),
        _portable_large_candidate,
    )  # fmt: skip


def prune_portable_configs(configs, named_args, **kwargs):
    """early_config_prune (Triton 2.2 passes only the positional arguments: everything but the tiles)."""
    args = {**named_args, **kwargs}
    a = args["a_ptr"]
    return portable_candidates(configs, args["M"], args["N"], a.element_size(), a.device)


def tma_candidates(configs, m: int, n: int, batch: int, element_size: int, activation, uses_z: bool,
                   out_size: int, device) -> List[triton.Config]:  # fmt: skip
    """The TMA kernel's configs worth timing for `batch` (times the split-K slices) (m, n) outputs
    of `out_size`-byte elements from `element_size` operands, with this epilogue."""
    return _prune(
        configs, m, n, batch,
        lambda c: _tma_smem(
            c.kwargs, c.num_stages, element_size, splits_epilogue(c.kwargs, activation, uses_z, out_size == 4),
            out_size,
        ),
        max_shared_memory(device),
        _tma_large_candidate,
    )  # fmt: skip


def prune_tma_configs(configs, named_args, **kwargs):
    """early_config_prune of the TMA kernel."""
    args = {**named_args, **kwargs}
    a = args["a_desc"].base
    return tma_candidates(
        configs, args["M"], args["N"], args["BATCH"] * args["SPLIT_K"], a.element_size(), args["ACTIVATION"],
        args["STORE_Z"] or args["GRAD_Z"], args["c_desc"].base.element_size(), a.device,
    )  # fmt: skip


# Split K (kernels.matmul_tma): only for problems whose 128x128 tiles fill at most half the SMs
# (the autotuner's smaller tiles serve the others better: measured on an H100 over 16k tokens, a
# 3072x1024 weight gradient, 192 tiles, took 0.158 ms whole and 0.180 in two slices), and only
# while each slice keeps SPLIT_K_MIN_DEPTH of K (32 steps of 64: the operand pipeline stays
# full). Each extra slice costs an fp32 partial tile written and read back (SPLIT_K_COST of the
# score per slice), so a split must raise the wave efficiency by more.
SPLIT_K_MAX = 8
SPLIT_K_MIN_DEPTH = 2048
SPLIT_K_COST = 0.03


def _wave_efficiency(items: int, slots: int) -> float:
    """Busy fraction of `slots` parallel workers over the waves that `items` equal work items take."""
    return items / (-(-items // slots) * slots)


@functools.lru_cache(maxsize=1024)  # asked on every plain launch, from the problem's sizes only
def split_k(batch: int, m: int, n: int, k: int, sms: int) -> int:
    """How many K slices a plain matmul's output tiles are split into (1: none), scored by the wave
    efficiency of 128x128 tiles over the SMs: a 1024x1024 weight gradient over 16k tokens has 64
    tiles for 132 SMs (0.48) and splits in 2 (0.97; H100: 0.072 -> 0.061 ms, cuBLAS 0.053)."""
    tiles = batch * -(-m // 128) * -(-n // 128)
    if 2 * tiles > sms:
        return 1
    best, best_score = 1, _wave_efficiency(tiles, sms)
    for split in range(2, SPLIT_K_MAX + 1):
        if k < split * SPLIT_K_MIN_DEPTH:
            break
        score = _wave_efficiency(tiles * split, sms) - SPLIT_K_COST * (split - 1)
        if score > best_score:
            best, best_score = split, score
    return best
