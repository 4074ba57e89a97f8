"""Autotune configurations, chosen for the H100 (132 SMs, 227 KB of shared memory per block, wgmma),
the pruning that keeps autotuning short, and the weight gradient's split of its last wave.

Each list holds a few configs that bracket the shapes that matter (training: tens of thousands
of rows; d_model 1024..8192). Autotuning compiles and times every config it keeps once per
(M, N, K), so `prune_*` keeps only what can win: configs whose operand stages fit in shared
memory for the operand dtype (fp32 halves what fits), tiles no larger than the problem, and,
for a problem whose output fills the GPU four times over with 128x128 tiles, only the large
tiles (128 rows, or two programs per SM of 64; smaller ones only add operand traffic there).
Shared memory per stage is (A tile + B tiles) x element size; registers, as compiled for sm_90
(cuobjdump, Triton 3.9, bf16, aligned operands), are noted per config: a config of <= 128
registers x 8 warps and <= ~113 KB leaves room for two programs on an SM, so that one's
epilogue overlaps the other's main loop.

The interpreter (TRITON_INTERPRET=1) gets one small config instead, so that the tiny shapes of
the CPU tests still span several tiles in every dimension (Triton's autotuner cannot time
anything without a GPU); tests pin the other epilogue variant explicitly.
"""

import triton

from .._compat import INTERPRETING
from .._runtime.tuning import SKINNY_ROWS, configs_for_rows

# Shared memory one block may use on an H100 (the opt-in maximum); a config that still does not
# fit elsewhere (A100: 163 KB) fails to launch and the autotuner skips it.
SHARED_MEMORY = 227 * 1024
# Output elements from which 128x128 tiles fill 132 SMs four times over: only large tiles compete.
LARGE_OUTPUT = 4 * 132 * 128 * 128
# The weight gradient's last-wave split (see weight_grad_split).
MAX_SPLIT = 4
MANY_WAVES = 8


def _configs(names, rows, pre_hook=None, extra=()):
    """triton.Config for each (block sizes..., group, num_warps, num_stages[, extra...]) row."""
    configs = []
    for row in rows:
        *blocks, group, num_warps, num_stages = row[: len(names) + 2]
        kwargs = dict(zip(names, blocks))
        kwargs[names[-1]] = group
        kwargs.update(zip(extra, row[len(names) + 2 :]))
        configs.append(triton.Config(kwargs, num_warps=num_warps, num_stages=num_stages, pre_hook=pre_hook))
    return configs


def _set_forward_tma_blocks(nargs):
    """Each config's tile shapes onto the host tensor descriptors, before its launch."""
    block_m, block_n, block_k = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["x_desc"].block_shape = [block_m, block_k]
    # W_TRANSPOSED: the weights' descriptors read (N, K) memory (nn.Linear weights), tiles transposed in the kernel.
    w_tile = [block_n, block_k] if nargs.get("W_TRANSPOSED") else [block_k, block_n]
    nargs["wg_desc"].block_shape = list(w_tile)
    nargs["wu_desc"].block_shape = list(w_tile)
    for name in ("h_desc", "g_desc", "u_desc"):  # g, u may be h's descriptor itself (nothing saved)
        nargs[name].block_shape = [block_m, block_n]


# Shared-A dual matmul (forward: x @ [w_gate, w_up]; weight grads: x^T @ [d_gate, d_up]).
# Two BLOCK_P x BLOCK_Q fp32 accumulators: 128x128 twice is a 128x256 tile's registers and
# arithmetic intensity, 128 accumulator registers per thread over 8 warps.
_DUAL_ROWS = [
    # P,   Q,   R, group, warps, stages   smem (16-bit); registers: TMA forward / weight grad
    (128, 128, 64, 8, 8, 3),  # 144 KB; 183 / 190: the workhorse for large shapes
    (128, 128, 64, 8, 8, 4),  # 192 KB: deeper pipeline, H100 only
    (128, 64, 64, 8, 4, 3),  # 96 KB; 202 regs x 4 warps: two programs per SM
    (64, 128, 64, 8, 4, 4),  # 160 KB: small M (few rows)
    (64, 64, 32, 8, 4, 3),  # 36 KB: anything, fp32 included
]
# The forward of at most SKINNY_ROWS (16) rows of 16-bit operands (_runtime.tuning.skinny_problem:
# a decode step's tokens) is bound by the weights' bytes: 16-row tiles, narrow (an intermediate of
# 5632 spreads over every SM) and deep in K, so that each stage streams 8-16 KB of the two weights.
# The pointer kernel only (the TMA kernel's wgmma tiles are 64 rows tall). Before them, a 1.4B
# model's decode step read its gate and up weights at 1.5 TB/s (H100).
_SKINNY_FORWARD_ROWS = [
    # M,          N,   K, group, warps, stages   smem (16-bit)
    (SKINNY_ROWS, 16, 256, 8, 4, 4),  # 96 KB
    (SKINNY_ROWS, 32, 128, 8, 4, 4),  # 80 KB
    (SKINNY_ROWS, 32, 256, 8, 4, 3),  # 120 KB
    (SKINNY_ROWS, 64, 128, 8, 4, 3),  # 108 KB
]
# The persistent TMA forward (Hopper): PROGRAMS_PER_SM programs per SM walk the tiles; with two,
# one program's epilogue runs beside the other's main loop. The epilogue's TMA stores stage one
# BLOCK_M x BLOCK_N tile (16-32 KB) in shared memory beside the operand stages.
_TMA_FORWARD_ROWS = [
    # M,   N,   K, group, warps, stages, PROGRAMS_PER_SM   smem; registers
    (128, 128, 64, 8, 8, 3, 1),  # 176 KB, 186 regs: the workhorse
    (64, 128, 64, 8, 4, 2, 2),  # 88 KB, 252 regs x 4 warps: two programs per SM
    (64, 128, 64, 8, 4, 3, 1),  # 128 KB: small M
    (64, 64, 32, 8, 4, 3, 1),  # 44 KB: anything
]
# Single accumulator (input grad: [d_gate, d_up] @ [w_gate, w_up]^T, one loop per pair, so the
# stages hold one pair's tiles).
_INPUT_GRAD_ROWS = [
    (128, 128, 64, 8, 8, 3),  # 96 KB: two programs per SM
    (128, 256, 64, 8, 8, 3),  # 144 KB; a 128x256 accumulator, the highest arithmetic intensity
    (128, 256, 32, 8, 8, 4),  # 96 KB: the same tile, shorter steps
    (64, 128, 64, 8, 4, 3),  # small M
    (64, 64, 32, 8, 4, 3),  # anything, fp32 included
]
# The input gradient by TMA (Hopper; one program per tile, a TMA store of dx). Measured at the
# headline (16384 x 5632 x 2 -> 2048, H100, Triton 3.6): 128x256x64 s3 1.00 ms, 128x256x32 s4 1.07,
# 128x128x64 s4 1.19; the pointer kernel's best 1.24, timed alongside. Shared memory: the stages
# plus the BLOCK_M x BLOCK_K output tile.
_INPUT_GRAD_TMA_ROWS = [
    (128, 256, 64, 8, 8, 3),  # 144 + 64 KB: the headline's
    (128, 256, 32, 8, 8, 4),  # 96 + 64 KB
    (128, 128, 64, 8, 8, 4),  # 128 + 32 KB
    (64, 128, 64, 8, 4, 4),  # small M
    (64, 64, 32, 8, 4, 3),  # anything
]
# The down projection's backward: dh = dy @ w_down^T with the SwiGLU backward as its epilogue.
# EPILOGUE_M < BLOCK_M: the epilogue walks the tile in row slices (few registers: two programs
# per SM, one's epilogue beside the other's main loop); EPILOGUE_M == BLOCK_M: g and u are
# loaded before the main loop (their latency hides behind it) and the epilogue is one pass.
_DOWN_GRAD_ROWS = [
    # M,   N,   D, group, warps, stages, EPILOGUE_M   smem; registers
    (128, 128, 64, 8, 8, 3, 32),  # 96 KB, 102 regs: two programs per SM
    (128, 128, 64, 8, 16, 3, 128),  # 96 KB, 128 regs x 16 warps: g, u prefetched, one program per SM
    (128, 256, 64, 8, 8, 3, 32),  # 144 KB, 182 regs: a 128x256 accumulator
    (64, 128, 64, 8, 8, 3, 64),  # 72 KB, 128 regs: small M, g, u prefetched, two programs per SM
    (64, 64, 32, 8, 4, 3, 32),  # 24 KB: anything, fp32 included
]
# The down projection's backward by TMA (Hopper; row-slice epilogue only). Measured at the
# headline (16384 x 2048 -> 5632, H100, Triton 3.6): 128x128x64 w8 s3
# 0.849 ms, at 4 warps 0.869, EPILOGUE_M 16 0.869 and 64 1.070, 2 stages 1.045, 256x128 0.918,
# 128x256 s4 0.914; the pointer kernel's best 0.900, timed alongside.
_DOWN_GRAD_TMA_ROWS = [
    # M,   N,   D, group, warps, stages, EPILOGUE_M   smem (16-bit)
    (128, 128, 64, 8, 8, 3, 32),  # 96 KB: two programs per SM
    (128, 128, 64, 8, 4, 3, 32),  # 96 KB at 4 warps
    (64, 128, 64, 8, 4, 3, 32),  # 72 KB: small M
    (64, 64, 32, 8, 4, 3, 32),  # 24 KB: anything
]
# The weight gradients by TMA (Hopper). Measured at the headline: 128x128x64 w8 s4 1.088 ms,
# s3 1.117 (1.145 without the last-wave split), 128x128x32 s5 1.244, 128x64x64 w4 s4 1.254; the
# pointer kernel's best 1.205 and cuBLAS on [d_gate | d_up] 1.109, timed alongside.
_WEIGHT_GRAD_TMA_ROWS = [
    # K,   N,   M, group, warps, stages   smem (16-bit)
    (128, 128, 64, 8, 8, 4),  # 192 KB: the headline's
    (128, 128, 64, 8, 8, 3),  # 144 KB
    (64, 128, 64, 8, 4, 4),  # 160 KB: small d_model
    (64, 64, 32, 8, 4, 3),  # 36 KB: anything
]
_INTERPRETER_ROW = [(32, 32, 16, 2, 4, 1)]
_INTERPRETER_TMA_ROW = [(32, 32, 16, 2, 4, 1, 1)]
# Row slices of 16 in the interpreter's 32-row tile: the sliced epilogue; tests pin the one-pass one.
_INTERPRETER_DOWN_ROW = [(32, 32, 16, 2, 4, 1, 16)]


def forward_configs(interpreting: bool = INTERPRETING):
    # The skinny rows before the last, the smallest, which the GPU tests pin.
    rows = _INTERPRETER_ROW if interpreting else _DUAL_ROWS[:-1] + _SKINNY_FORWARD_ROWS + _DUAL_ROWS[-1:]
    return _configs(("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"), rows)


def forward_tma_configs(interpreting: bool = INTERPRETING):
    rows = _INTERPRETER_TMA_ROW if interpreting else _TMA_FORWARD_ROWS
    names = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")
    return _configs(names, rows, _set_forward_tma_blocks, extra=("PROGRAMS_PER_SM",))


def weight_grad_configs(interpreting: bool = INTERPRETING):
    return _configs(("BLOCK_K", "BLOCK_N", "BLOCK_M", "GROUP_K"), _INTERPRETER_ROW if interpreting else _DUAL_ROWS)


def input_grad_configs(interpreting: bool = INTERPRETING):
    rows = _INTERPRETER_ROW if interpreting else _INPUT_GRAD_ROWS
    return _configs(("BLOCK_M", "BLOCK_K", "BLOCK_N", "GROUP_M"), rows)


def _set_input_grad_tma_blocks(nargs):
    """Each config's tile shapes onto the host tensor descriptors, before its launch."""
    block_m, block_k, block_n = nargs["BLOCK_M"], nargs["BLOCK_K"], nargs["BLOCK_N"]
    nargs["dg_desc"].block_shape = [block_m, block_n]
    nargs["du_desc"].block_shape = [block_m, block_n]
    nargs["wg_desc"].block_shape = [block_k, block_n]
    nargs["wu_desc"].block_shape = [block_k, block_n]
    nargs["dx_desc"].block_shape = [block_m, block_k]


def input_grad_tma_configs(interpreting: bool = INTERPRETING):
    rows = _INTERPRETER_ROW if interpreting else _INPUT_GRAD_TMA_ROWS
    return _configs(("BLOCK_M", "BLOCK_K", "BLOCK_N", "GROUP_M"), rows, _set_input_grad_tma_blocks)


def down_grad_configs(interpreting: bool = INTERPRETING):
    rows = _INTERPRETER_DOWN_ROW if interpreting else _DOWN_GRAD_ROWS
    return _configs(("BLOCK_M", "BLOCK_N", "BLOCK_D", "GROUP_M"), rows, extra=("EPILOGUE_M",))


def _set_down_grad_tma_blocks(nargs):
    """Each config's tile shapes onto the host tensor descriptors, before its launch."""
    nargs["dy_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_D"]]
    nargs["wd_desc"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_D"]]


def down_grad_tma_configs(interpreting: bool = INTERPRETING):
    rows = _INTERPRETER_DOWN_ROW if interpreting else _DOWN_GRAD_TMA_ROWS
    names = ("BLOCK_M", "BLOCK_N", "BLOCK_D", "GROUP_M")
    return _configs(names, rows, _set_down_grad_tma_blocks, extra=("EPILOGUE_M",))


def _set_weight_grad_tma_blocks(nargs):
    """Each config's tile shapes onto the host tensor descriptors, before its launch."""
    block_m = nargs["BLOCK_M"]
    nargs["x_desc"].block_shape = [block_m, nargs["BLOCK_K"]]
    nargs["dg_desc"].block_shape = [block_m, nargs["BLOCK_N"]]
    nargs["du_desc"].block_shape = [block_m, nargs["BLOCK_N"]]


def weight_grad_tma_configs(interpreting: bool = INTERPRETING):
    rows = _INTERPRETER_ROW if interpreting else _WEIGHT_GRAD_TMA_ROWS
    return _configs(("BLOCK_K", "BLOCK_N", "BLOCK_M", "GROUP_K"), rows, _set_weight_grad_tma_blocks)


def _element_size(named_args, pointer: str, descriptor: str) -> int:
    """The operand's element size, from the pointer kernel's tensor or the TMA kernel's descriptor."""
    return (named_args[pointer] if pointer in named_args else named_args[descriptor].base).element_size()


def _prune(configs, size_p, size_q, p, q, r, b_tiles, element_size):
    """The configs that fit and suit a (size_p, size_q) output (see the module docstring); at
    least the smallest. p, q, r: the config's names for the output and reduction blocks;
    b_tiles: B tiles per stage (2 for the dual matmul)."""

    def smem(config):
        kw = config.kwargs
        stages = config.num_stages * (kw[p] * kw[r] + b_tiles * kw[r] * kw[q]) * element_size
        return stages * kw.get("PROGRAMS_PER_SM", 1)

    smallest_p = min(c.kwargs[p] for c in configs)
    smallest_q = min(c.kwargs[q] for c in configs)

    def large_tile(config):
        """128-row tiles of at least 128 x 128 outputs, or two programs per SM of half that."""
        kw = config.kwargs
        rows = kw[p] * kw.get("PROGRAMS_PER_SM", 1)
        return rows >= 128 and kw[p] * kw[q] * b_tiles >= 128 * 128

    large = size_p * size_q >= LARGE_OUTPUT
    kept = [
        c
        for c in configs
        if smem(c) <= SHARED_MEMORY
        and c.kwargs[p] <= max(triton.next_power_of_2(size_p), smallest_p)
        and c.kwargs[q] <= max(triton.next_power_of_2(size_q), smallest_q)
        and (not large or large_tile(c))
    ]
    return kept or [min(configs, key=smem)]


# early_config_prune hooks (Triton 2.2 passes the positional arguments only: sizes and tensors).
def prune_forward(configs, named_args, **kwargs):
    size = _element_size(named_args, "x_ptr", "x_desc")
    m = named_args["M"]
    return _prune(configs_for_rows(configs, m, size), m, named_args["N"], "BLOCK_M", "BLOCK_N", "BLOCK_K", 2, size)


def prune_weight_grad(configs, named_args, **kwargs):
    size = _element_size(named_args, "x_ptr", "x_desc")
    return _prune(configs, named_args["K"], named_args["N"], "BLOCK_K", "BLOCK_N", "BLOCK_M", 2, size)


def prune_input_grad(configs, named_args, **kwargs):
    size = _element_size(named_args, "dg_ptr", "dg_desc")
    return _prune(configs, named_args["M"], named_args["K"], "BLOCK_M", "BLOCK_K", "BLOCK_N", 1, size)


def prune_down_grad(configs, named_args, **kwargs):
    size = _element_size(named_args, "dy_ptr", "dy_desc")
    return _prune(configs, named_args["M"], named_args["N"], "BLOCK_M", "BLOCK_N", "BLOCK_D", 1, size)


def weight_grad_split(tiles: int, multiprocessors: int, steps: int) -> int:
    """How many programs share each tile of the weight gradient's last, partial wave (1: none).

    The weight gradient has few output tiles and long reductions (x 16384 x 2048, intermediate
    5632: 704 tiles of 128x128 on 132 SMs, 5 full waves and 44 tiles alone in a sixth that
    leaves 88 SMs idle for a whole tile's time). The `tiles % multiprocessors` tiles of that
    wave each split their reduction over `split` programs (split x remainder <= SMs), which
    fill the wave with programs 1/split as long; a small second kernel adds the partial sums in
    a fixed order. Past MANY_WAVES full waves the idle tail is under 1/8 of the time: no split.
    Each program keeps at least one reduction step (split <= steps).
    """
    remainder = tiles % multiprocessors
    if remainder == 0 or tiles // multiprocessors >= MANY_WAVES:
        return 1
    return max(1, min(multiprocessors // remainder, MAX_SPLIT, steps))


def weight_grad_plan(args) -> int:
    """weight_grad_split for the config being launched (a heuristic: the config's blocks are in args)."""
    tiles = triton.cdiv(args["K"], args["BLOCK_K"]) * triton.cdiv(args["N"], args["BLOCK_N"])
    return weight_grad_split(tiles, args["NUM_SMS"], triton.cdiv(args["M"], args["BLOCK_M"]))
