"""Autotune configs of the two matmul kernels, sized for the H100 (and fine on the A100).

H100 facts that shape them: 132 SMs, 227 KB of shared memory per block, wgmma works on 64-row
warpgroup slices, so 8 warps cover a 128-row tile, and 128x256 is the largest tile whose fp32
accumulator (128 registers per thread at 8 warps) leaves room for the epilogue.

Shared memory, as compiled for sm_90 (`metadata.shared`, Triton 3.6 as on the GPU box; 3.9 within
2 KB), is what the prune models, so that no candidate is compiled only to fail its launch: the TMA
kernel's 128x256x64 three-stage config takes 208 KB (3 x 48 KB of operand stages + one 64 KB
output staging buffer, which the saved derivative's store reuses), 224 KB with the backward
prologue (its S tile adds stages - 2 A tiles) and 228 KB with the d(bias) row sums too: one KB
over the H100's 227, so the weight gradient with bias and activation runs 128x256x32 (four
stages, 180 KB) or the ping-pong 128x128 (98 KB each). A 3-D (bmm) output store takes half an
output tile more (240 KB at 128x256x64: bmm runs the 32-deep or the ping-pong configs). The
portable kernel stages only its operands (144-180 KB at most in bf16); fp32 operands double
that.

Under the interpreter the autotuner cannot time anything: it gets one config, small, so that
CPU-sized test shapes still span several tiles in every dim and the tile edges are exercised.
"""

from __future__ import annotations

from typing import Dict, List

import triton

from .._compat import INTERPRETING, max_shared_memory

# Autotune keys: the problem size and every constexpr that changes the work per tile.
PORTABLE_KEY = ["M", "N", "K", "PROLOGUE", "ROW_SUM", "HAS_BIAS", "ACTIVATION", "STORE_AUX", "ALLOW_TF32"]
TMA_KEY = [
    *("M", "N", "K", "BATCH", "PROLOGUE", "ROW_SUM", "HAS_BIAS", "ACTIVATION", "STORE_AUX"),
    *("A_TRANS", "B_TRANS", "C_TRANS"),
]

# Output elements from which 128x128 tiles fill 132 SMs four times over: only large tiles compete.
LARGE_PROBLEM = 4 * 132 * 128 * 128

INTERPRETER_TILE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}


def EVEN_K_HEURISTIC(args: Dict) -> bool:
    return args["K"] % args["BLOCK_K"] == 0


def _config(block_m, block_n, block_k, num_warps, num_stages, pre_hook=None, **extra) -> triton.Config:
    tile = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": 8, **extra}
    return triton.Config(tile, num_warps=num_warps, num_stages=num_stages, pre_hook=pre_hook)


def portable_configs(interpreting: bool = INTERPRETING) -> List[triton.Config]:
    """Pointer-based kernel: large tiles for large problems, smaller ones for thin or fp32 problems."""
    if interpreting:
        return [triton.Config(dict(INTERPRETER_TILE), num_warps=1, num_stages=1)]
    return [
        _config(128, 256, 64, 8, 3),
        _config(256, 128, 64, 8, 3),
        _config(128, 256, 32, 8, 4),
        _config(128, 128, 64, 8, 4),
        _config(128, 128, 32, 4, 4),
        _config(64, 128, 32, 4, 4),
        _config(128, 64, 32, 4, 4),
        _config(64, 64, 32, 4, 3),
        _config(32, 64, 32, 4, 3),
    ]


def set_tma_block_shapes(nargs: Dict) -> None:
    """Autotune pre-hook: give each tensor descriptor the block shape of the config being run."""
    block_m, block_n, block_k = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    lead = [1] if nargs["BATCHED"] else []
    a_block = [block_k, block_m] if nargs["A_TRANS"] else [block_m, block_k]
    b_block = [block_n, block_k] if nargs["B_TRANS"] else [block_k, block_n]
    c_block = [block_n, block_m] if nargs["C_TRANS"] else [block_m, block_n]
    for name, block in (("a_desc", a_block), ("s_desc", a_block), ("b_desc", b_block), ("c_desc", c_block),
                        ("aux_desc", c_block)):  # fmt: skip
        if nargs[name] is not None:
            nargs[name].block_shape = lead + block


def tma_configs(interpreting: bool = INTERPRETING) -> List[triton.Config]:
    """Persistent TMA kernel (Hopper): wgmma-sized tiles, 2-4 stages, one or two programs per SM.

    One program per SM with 8 warps (two warpgroups on one tile) is the plain matmul's shape. The
    epilogue (GELU and its derivative: ~20 instructions and two special-function ops per element)
    leaves the tensor cores idle while it runs; with two 4-warp programs per SM (half the shared
    memory each) one program's epilogue overlaps the other's main loop, as a ping-pong schedule.
    """
    if interpreting:
        tile = dict(INTERPRETER_TILE, PROGRAMS_PER_SM=1)
        return [triton.Config(tile, num_warps=4, num_stages=1, pre_hook=set_tma_block_shapes)]
    return [
        _config(128, 256, 64, 8, 3, set_tma_block_shapes, PROGRAMS_PER_SM=1),
        _config(128, 256, 32, 8, 4, set_tma_block_shapes, PROGRAMS_PER_SM=1),
        _config(256, 128, 64, 8, 3, set_tma_block_shapes, PROGRAMS_PER_SM=1),
        _config(128, 128, 64, 8, 4, set_tma_block_shapes, PROGRAMS_PER_SM=1),
        _config(128, 128, 64, 4, 2, set_tma_block_shapes, PROGRAMS_PER_SM=2),
        _config(64, 256, 64, 4, 2, set_tma_block_shapes, PROGRAMS_PER_SM=2),
        _config(128, 128, 64, 4, 3, set_tma_block_shapes, PROGRAMS_PER_SM=1),
        _config(64, 128, 64, 4, 4, set_tma_block_shapes, PROGRAMS_PER_SM=1),
    ]


def _portable_smem(kw: Dict, num_stages: int, element_size: int, prologue: bool) -> int:
    """Operand stages; the prologue's S tile adds (stages - 2) A tiles (as compiled for sm_90)."""
    a_tile = kw["BLOCK_M"] * kw["BLOCK_K"] * element_size
    b_tile = kw["BLOCK_K"] * kw["BLOCK_N"] * element_size
    return num_stages * (a_tile + b_tile) + (max(num_stages - 2, 0) * a_tile if prologue else 0)


def _tma_smem(kw: Dict, num_stages: int, element_size: int, prologue: bool, row_sum: bool, batched_store: bool) -> int:
    """Operand stages, one output staging tile (half another for a 3-D store), the prologue's
    (stages - 2) A tiles, 4 KB for the row sums' reduction."""
    out_tile = kw["BLOCK_M"] * kw["BLOCK_N"] * element_size
    extra = (out_tile // 2 if batched_store else 0) + (4096 if row_sum else 0)
    return _portable_smem(kw, num_stages, element_size, prologue) + out_tile + extra


def _portable_large_candidate(config: triton.Config) -> bool:
    """For a problem that fills the GPU several times over: tiles of at least 128x128 and 8 warps."""
    kw = config.kwargs
    return kw["BLOCK_M"] * kw["BLOCK_N"] >= 128 * 128 and config.num_warps == 8


def _tma_large_candidate(config: triton.Config) -> bool:
    """For a problem that fills the GPU several times over: the cooperative 128x256 / 256x128 tiles
    (8 warps, one program per SM) and the two ping-pong configs (two 4-warp programs per SM). Each
    candidate costs a compile per fused variant on first use; these are the ones that can win there."""
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


def prune_portable_configs(configs, named_args, **kwargs):
    """early_config_prune (Triton 2.2 passes only the positional arguments: everything but the tiles)."""
    args = {**named_args, **kwargs}
    a = args["a_ptr"]
    size, prologue = a.element_size(), args["PROLOGUE"] != 0
    # The batch count is not an argument of the portable kernel (it is in the grid): counted as 1.
    return _prune(
        configs, args["M"], args["N"], 1,
        lambda c: _portable_smem(c.kwargs, c.num_stages, size, prologue), max_shared_memory(a.device),
        _portable_large_candidate,
    )  # fmt: skip


def prune_tma_configs(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    a = args["a_desc"].base
    size, prologue, row_sum = a.element_size(), args["PROLOGUE"] != 0, bool(args["ROW_SUM"])
    batched_store = bool(args["BATCHED"]) and not args["C_TRANS"]
    return _prune(
        configs, args["M"], args["N"], args["BATCH"],
        lambda c: _tma_smem(c.kwargs, c.num_stages, size, prologue, row_sum, batched_store),
        max_shared_memory(a.device),
        _tma_large_candidate,
    )  # fmt: skip
