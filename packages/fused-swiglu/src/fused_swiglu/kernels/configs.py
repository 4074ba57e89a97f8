"""Autotune configurations, chosen for the H100 (132 SMs, 228 KB shared memory per SM, wgmma).

Each list holds a few configs that bracket the shapes that matter (training: tens of thousands
of rows; d_model 1024..8192): autotuning compiles and times every config once per (M, N, K),
so the lists stay short. Shared memory per stage is (A tile + B tiles) x element size; the
deepest pipelines below need up to 192 KB (H100); where they do not fit (A100: 164 KB, or fp32
operands) Triton's autotuner skips them as out of resources and the shallower ones remain.
Every list ends with a small config that fits anywhere (fp32 included). One config per list
fits two CTAs on an SM (<= ~113 KB of shared memory, <= 128 x 255 registers): while one CTA
runs its epilogue (stores of h, g, u; or the loads and stores of the backward step) the other
keeps the tensor cores busy, which a one-CTA-per-SM pipeline cannot do without persistence.

The interpreter (TRITON_INTERPRET=1) gets one small config instead, so that the tiny shapes of
the CPU tests still span several tiles in every dimension (Triton's autotuner cannot time
anything without a GPU).
"""

import triton

from .._compat import INTERPRETING


def _configs(names, rows, pre_hook=None):
    """triton.Config for each (block sizes..., group, num_warps, num_stages) row."""
    configs = []
    for *blocks, group, num_warps, num_stages in rows:
        kwargs = dict(zip(names, blocks))
        kwargs[names[-1]] = group
        configs.append(triton.Config(kwargs, num_warps=num_warps, num_stages=num_stages, pre_hook=pre_hook))
    return configs


def _set_forward_tma_blocks(nargs):
    """Each config's tile shapes onto the host tensor descriptors, before its launch."""
    block_m, block_n, block_k = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["x_desc"].block_shape = [block_m, block_k]
    nargs["wg_desc"].block_shape = [block_k, block_n]
    nargs["wu_desc"].block_shape = [block_k, block_n]


# Shared-A dual matmul (forward: x @ [w_gate, w_up]; weight grads: x^T @ [d_gate, d_up]).
# Two BLOCK_P x BLOCK_Q fp32 accumulators: 128x128 twice is a 128x256 tile's registers and
# arithmetic intensity, 128 accumulator registers per thread over 8 warps.
_DUAL_ROWS = [
    # P,   Q,   R, group, warps, stages   smem/stage (16-bit)
    (128, 128, 64, 8, 8, 3),  # 48 KB: the workhorse for large shapes
    (128, 128, 64, 8, 8, 4),  # 48 KB x 4 = 192 KB: deeper pipeline, H100 only
    (128, 64, 64, 8, 4, 3),  # 32 KB x 3 = 96 KB: two CTAs per SM overlap epilogues and main loops
    (64, 128, 64, 8, 4, 4),  # 40 KB: small M (few rows)
    (64, 64, 32, 8, 4, 3),  # 12 KB: anything, fp32 included
]
# Sum-of-products / single matmul (input grad: [d_gate, d_up] @ [w_gate, w_up]^T; the down
# projection's backward): one accumulator.
_SINGLE_ROWS = [
    (128, 128, 64, 8, 8, 3),  # two pairs: 64 KB/stage; one pair (down projection): 96 KB, two CTAs/SM
    (128, 256, 32, 8, 8, 4),  # two pairs: 48 KB/stage; one accumulator of 128 regs/thread
    (128, 128, 32, 8, 4, 3),  # two pairs: 32 KB x 3 = 96 KB, two CTAs per SM (one pair: 48 KB)
    (64, 128, 64, 8, 4, 3),  # small M
    (64, 64, 32, 8, 4, 3),  # anything, fp32 included
]
_INTERPRETER_ROW = [(32, 32, 16, 2, 4, 1)]


def _rows(rows):
    return _INTERPRETER_ROW if INTERPRETING else rows


def forward_configs():
    return _configs(("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"), _rows(_DUAL_ROWS))


def forward_tma_configs():
    return _configs(("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"), _rows(_DUAL_ROWS), _set_forward_tma_blocks)


def weight_grad_configs():
    return _configs(("BLOCK_K", "BLOCK_N", "BLOCK_M", "GROUP_K"), _rows(_DUAL_ROWS))


def input_grad_configs():
    return _configs(("BLOCK_M", "BLOCK_K", "BLOCK_N", "GROUP_M"), _rows(_SINGLE_ROWS))


def down_grad_configs():
    return _configs(("BLOCK_M", "BLOCK_N", "BLOCK_D", "GROUP_M"), _rows(_SINGLE_ROWS))
