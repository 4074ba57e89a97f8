"""Launch configurations of the attention kernels and their autotuners.

Each kernel has a short list of block shapes per padded head dim (BLOCK_D of 64 or less, 128,
256) and per load path, chosen for the H100 (132 SMs, 227 KB of shared memory per block, 255
registers per thread) from `ptxas -v` register and spill counts of sm_90 builds (Triton 3.9):
the forward is spill-free; the dK/dV kernel at BLOCK_D 128 holds two [128, 128] fp32
accumulators (128 registers a thread) and spills a little (TMA, causal, atomic dQ: 32x128 about
180-230 bytes, 16x128 about 90, 32x64 about 60; without the atomic dQ 32x128 spills about 80),
at 64 it is spill-free, at 256 it spills (its [64, 256] accumulators). K and V stay in shared
memory as the A operands of their products; P^T and dS^T feed theirs from registers. Lists are
short because each entry is a compile on first use.
The autotuner keys on the head dim, the mask/bias specialization and the dQ mode (and the
dtypes), not on exact sequence lengths, so a varlen batch never re-tunes; there is one autotuner
per class of longest sequence (a power of two, clamped to 1024..8192), because the best tile
depends on it. It runs once per launch plan, through the runtime's tuning (`tuned_kernel`): the
plan's later calls launch its choice directly. When interpreting, each kernel runs one small
config instead, so that tiny test shapes span several blocks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import triton

from .._runtime.compat import INTERPRETING
from .._runtime.tuning import TunedKernel
from ..kernels.attention_bwd import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel
from ..kernels.attention_fwd import _attn_fwd_kernel

KERNELS = {"fwd": _attn_fwd_kernel, "dkdv": _attn_bwd_dkdv_kernel, "dq": _attn_bwd_dq_kernel}

# What the best config depends on besides the tensor dtypes (which the autotuner adds itself).
AUTOTUNE_KEY = {
    "fwd": ["HEAD_DIM", "IS_VARLEN", "HAS_LEFT", "HAS_RIGHT", "ALIBI", "SOFTCAP", "BLOCK_MAJOR"],
    "dkdv": ["HEAD_DIM", "IS_VARLEN", "HAS_LEFT", "HAS_RIGHT", "ALIBI", "SOFTCAP", "DQ_ATOMIC", "BLOCK_MAJOR"],
    "dq": ["HEAD_DIM", "IS_VARLEN", "HAS_LEFT", "HAS_RIGHT", "ALIBI", "SOFTCAP", "BLOCK_MAJOR"],
}
# Arguments each timed autotune run must find zeroed: the dK/dV kernel adds into the fp32 dQ
# accumulator (DQ_ATOMIC; otherwise the argument is dK, which the kernel overwrites).
RESET_TO_ZERO = {"fwd": None, "dkdv": ["dq_accum_ptr"], "dq": None}

# The backward's dQ: True adds each key block's share into an fp32 accumulator with atomics inside
# the dK/dV kernel (5 matmuls per block pair; not bit-reproducible), False runs the separate dQ
# kernel (7 matmuls; deterministic). Per BLOCK_D class, where the atomic path can run at all: at
# 128 the dK/dV kernel, already holding two [128, 128] fp32 accumulators, spills more with the dQ
# work added and loses everywhere (H100, Triton 3.6, hidden 2048, 16k tokens, fwd+bwd: causal
# S = 4096 257 against 302 TFLOP/s; full S = 16384 276 against 327); at 256 the separate kernel is
# the only one that fits.
DQ_ATOMIC = {64: True, 128: False, 256: False}
# ...and at 64 only from these longest sequences on (full; causal), None: never. On the GPU the dQ
# kernel runs at every length: on an H100 (Triton 3.6, D = 64, H = 32, 16k tokens, each path autotuned)
# the backward with atomics takes 1.10-1.35x the dQ kernel's time at S = 2048-16384, causal and full
# (causal S = 4096: 2.725 against 2.279 ms), as the atomic dK/dV kernel spills at 4 warps (64x64:
# 456 bytes; 8 warps hold 255 registers). The atomic path stays so that the interpreter's tiny shapes
# take it and the CPU tests cover both paths; a GPU test forces it at real sizes.
# Slower on the same H100 and not used: the dQ shares as bulk reduce-adds through a TMA descriptor of
# the accumulator (`desc.atomic_add`), at best level with the dQ kernel (D = 128 causal S = 4096:
# 3.376 against 3.168 ms); and adds in the dot's own register layout with red.global.add.v2.f32 (inline
# PTX, no layout conversion through shared memory), 2-40 % slower config by config.
DQ_ATOMIC_MIN_SEQLEN: Optional[int] = 0 if INTERPRETING else None
DQ_ATOMIC_MIN_SEQLEN_CAUSAL: Optional[int] = 0 if INTERPRETING else None


@dataclass(frozen=True)
class KernelConfig:
    """Block shape and launch options of one attention kernel launch."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    use_tma: bool = False

    def meta(self) -> Dict[str, object]:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "USE_TMA": self.use_tma}


C = KernelConfig
# Per kernel, per BLOCK_D class: the candidates, best guess first.
# fwd: BLOCK_M queries stay on chip, BLOCK_N keys stream.
# dkdv: BLOCK_N keys stay on chip (dK, dV accumulate in registers), BLOCK_M queries stream.
# dq: BLOCK_M queries stay on chip (dQ accumulates), BLOCK_N keys stream.
# Hopper with TMA: tiles sit in shared memory, not registers, so larger tiles fit without spills.
# Measured on an H100 (Triton 3.6, each config alone): at 64, at a 410M GPT's attention (causal,
# B = 8, S = 2048, H = 16, fwd+bwd), the 4-warp dK/dV 32x128 and dQ 64x64 tiles take 0.958 and
# 0.913 ms against 1.001 without the 4-warp tiles. At 128 (B = 4, H = 16, S = 4096, backward alone):
# dK/dV 64x64 4 warps 2 stages 2.236 ms causal against 2.589 for 32x128 8 warps (16x128 and 64x128
# 8 warps lose more), dQ 128x64 8 warps 2.360 with 3 stages against 2.574 with 2; the forward
# (H200, CUDA-graph timing) 128x128 8 warps 3 stages 0.555 ms causal against 0.696 with 2 stages
# and 0.611 for 128x64.
TMA_CONFIGS: Dict[str, Dict[int, List[KernelConfig]]] = {
    "fwd": {
        64: [
            C(128, 128, 8, 3, True),
            C(128, 64, 8, 3, True),
            C(64, 64, 4, 3, True),
            C(64, 128, 4, 3, True),
            C(128, 64, 4, 3, True),
        ],
        128: [C(128, 128, 8, 3, True), C(128, 64, 8, 3, True), C(64, 64, 4, 3, True)],
        256: [C(64, 64, 8, 2, True), C(128, 32, 8, 2, True)],
    },
    "dkdv": {
        64: [
            C(32, 128, 8, 2, True),
            C(64, 128, 8, 2, True),
            C(32, 64, 4, 2, True),
            C(32, 128, 4, 2, True),
            C(64, 64, 4, 2, True),
        ],
        128: [C(64, 64, 4, 2, True), C(32, 64, 4, 3, True), C(64, 128, 8, 3, True), C(32, 128, 8, 2, True)],
        256: [C(16, 64, 8, 2, True)],
    },
    "dq": {
        64: [C(128, 64, 8, 3, True), C(64, 64, 4, 3, True), C(64, 32, 4, 3, True), C(128, 64, 4, 3, True)],
        128: [C(128, 64, 8, 3, True), C(64, 64, 4, 2, True)],
        256: [C(64, 32, 8, 2, True), C(64, 64, 8, 2, True)],
    },
}
# Pointer loads (Ampere, Triton < 3.4, or tensors a TMA descriptor cannot describe).
POINTER_CONFIGS: Dict[str, Dict[int, List[KernelConfig]]] = {
    "fwd": {
        64: [C(128, 64, 8, 3), C(64, 64, 4, 3)],
        128: [C(128, 64, 8, 3), C(64, 64, 4, 3)],
        256: [C(128, 32, 8, 2), C(64, 32, 4, 2)],
    },
    "dkdv": {
        64: [C(32, 128, 8, 2), C(16, 128, 8, 2)],
        128: [C(32, 64, 8, 2), C(16, 128, 8, 2)],
        256: [C(16, 64, 8, 2)],
    },
    "dq": {
        64: [C(128, 64, 8, 3)],
        128: [C(128, 64, 8, 2)],
        256: [C(64, 32, 8, 2), C(64, 32, 4, 2)],
    },
}

# Interpreter: small, unequal blocks, so that shapes of a few dozen positions cover the masked and
# unmasked loop ranges and query/key blocks that do not line up.
INTERPRETER_CONFIGS = {"fwd": C(32, 16, 4, 1), "dkdv": C(16, 32, 4, 1), "dq": C(32, 16, 4, 1)}

# The delta = rowsum(dO * O) pre-pass (which also zeroes the dQ accumulator) and the dQ
# conversion are memory-bound: a fixed config per BLOCK_D.
PREPROCESS_BLOCK_M = {64: 128, 128: 64, 256: 32}
PREPROCESS_WARPS = 4


def block_d_class(block_d: int) -> int:
    return max(64, block_d)


def candidate_configs(kind: str, block_d: int, tma: bool) -> List[KernelConfig]:
    """The configs the autotuner tries for `kind` at this BLOCK_D (TMA variants on Hopper)."""
    if INTERPRETING:
        return [INTERPRETER_CONFIGS[kind]]
    return list((TMA_CONFIGS if tma else POINTER_CONFIGS)[kind][block_d_class(block_d)])


def preprocess_block_m(block_d: int) -> int:
    return 16 if INTERPRETING else PREPROCESS_BLOCK_M[block_d_class(block_d)]


def dq_atomic(
    block_d: int, deterministic: bool, max_seqlen: int, causal: bool, kv_programs: int, group: int, sm_count: int
) -> bool:
    """Whether the backward accumulates dQ with atomics in the dK/dV kernel (see DQ_ATOMIC; at
    BLOCK_D 64 only when the longest sequence, max_seqlen, reaches DQ_ATOMIC_MIN_SEQLEN, or
    DQ_ATOMIC_MIN_SEQLEN_CAUSAL for causal attention; on the GPU these are None today: never).

    The atomic path moves the dQ work into the dK/dV kernel, whose grid is kv_programs (batch x
    kv heads x key blocks of ~128) programs, each looping over the `group` query heads of its kv
    head. When that grid fills under half of the `sm_count` SMs and groups are large (MQA-like
    GQA at small batch), the separate dQ kernel, with a program per query head, spreads the work
    better: there the deterministic path is taken. (sm_count 0, when interpreting: no such limit.)
    """
    shortest = DQ_ATOMIC_MIN_SEQLEN_CAUSAL if causal else DQ_ATOMIC_MIN_SEQLEN
    if deterministic or not DQ_ATOMIC[block_d_class(block_d)] or shortest is None or max_seqlen < shortest:
        return False
    return 2 * kv_programs >= sm_count or group < 4


def _descriptor_hook(names: Tuple[str, ...], block: str):
    """Autotune pre-hook: give the TMA descriptors the block shape of the config being launched."""

    def hook(nargs):
        rows, block_d = nargs[block], nargs["BLOCK_D"]
        for name in names:
            nargs[name].block_shape = [1, 1, rows, block_d] if nargs["HEADS_OUTER"] else [1, rows, 1, block_d]

    return hook


# The descriptors each kernel takes and which block dim they tile.
DESCRIPTORS = {
    "fwd": (("k_desc", "v_desc"), "BLOCK_N"),
    "dkdv": (("q_desc", "do_desc"), "BLOCK_M"),
    "dq": (("k_desc", "v_desc"), "BLOCK_N"),
}


def length_class(max_seqlen: int) -> int:
    """The autotuner class of a longest sequence: its power of two, clamped to 2^10..2^13."""
    return min(max(max(max_seqlen - 1, 0).bit_length(), 10), 13)


@functools.cache
def autotuned_kernel(kind: str, block_d: int, tma: bool, seq_class: int = 10):
    """`kind`'s kernel under an autotuner over candidate_configs (built on first use), one per
    seq_class (`length_class` of the longest sequence): a config tuned at one length can be far
    from the best at another (measured on an H100, D = 64 causal fwd+bwd at S = 4096: 236 TFLOP/s
    with the dK/dV tile tuned at S = 512, 282 with the one tuned at 1024). It runs through
    `tuned_kernel`, once per launch plan."""
    hook = _descriptor_hook(*DESCRIPTORS[kind]) if tma else None
    configs = [
        triton.Config(c.meta(), num_warps=c.num_warps, num_stages=c.num_stages, pre_hook=hook)
        for c in candidate_configs(kind, block_d, tma)
    ]
    return triton.autotune(configs=configs, key=AUTOTUNE_KEY[kind], reset_to_zero=RESET_TO_ZERO[kind])(KERNELS[kind])


@functools.cache
def tuned_kernel(kind: str, block_d: int, tma: bool, seq_class: int) -> TunedKernel:
    """autotuned_kernel(...) tuned once per launch plan: the autotuner chooses under the kernel's
    lock on a plan's first call, and a Launch of its choice runs the plan's later calls."""
    return TunedKernel(autotuned_kernel(kind, block_d, tma, seq_class))


def clear() -> None:
    """Forget the autotuners and their choices (after a test changes the candidate configs)."""
    autotuned_kernel.cache_clear()
    tuned_kernel.cache_clear()
