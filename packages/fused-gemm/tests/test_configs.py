"""The autotune candidates each problem gets after pruning (no kernel runs): what fits and what suits the size."""

import pytest

from fused_gemm._runtime.compat import HOPPER_SHARED_MEMORY_PER_BLOCK
from fused_gemm._runtime.tuning import configs_for_rows
from fused_gemm.kernels.configs import (
    GRAD_TILE,
    _portable_large_candidate,
    _portable_smem,
    _prune,
    _tma_large_candidate,
    _tma_smem,
    grad_rows,
    grad_tile,
    interpreter_config,
    portable_configs,
    split_k,
    tma_configs,
)

H100 = HOPPER_SHARED_MEMORY_PER_BLOCK


def _tiles(configs):
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, programs per SM) of each config."""
    return {
        (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages,
         c.kwargs.get("PROGRAMS_PER_SM", 1))
        for c in configs
    }  # fmt: skip


def _tma(m, n, batch=1, halves=False):
    configs = tma_configs(interpreting=False)
    smem = lambda c: _tma_smem(c.kwargs, c.num_stages, 2, halves or c.kwargs["EPILOGUE_SPLIT"])  # noqa: E731
    return _tiles(_prune(configs, m, n, batch, smem, H100, _tma_large_candidate))


def _portable(m, n, element_size=2):
    configs = portable_configs(interpreting=False)
    smem = lambda c: _portable_smem(c.kwargs, c.num_stages, element_size)  # noqa: E731
    return _tiles(_prune(configs_for_rows(configs, m, element_size), m, n, 1, smem, H100, _portable_large_candidate))


COOPERATIVE = {(128, 256, 64, 8, 3, 1), (128, 256, 64, 8, 4, 1), (256, 128, 64, 8, 3, 1)}
PING_PONG = {(128, 128, 64, 4, 2, 2), (64, 256, 64, 4, 2, 2), (128, 128, 64, 4, 3, 2), (128, 128, 64, 8, 3, 2)}


def test_model_shapes_keep_the_large_hopper_tiles():
    """As compiled for sm_90 (configs module docstring): every variant of a 1.4B model's linear shapes
    at 16384 tokens fits the cooperative and the ping-pong candidates (the matmuls have no prologue or
    row sums to stage)."""
    assert _tma(16384, 8192) == COOPERATIVE | PING_PONG  # forward, plain or biased: whole-tile staging
    assert _tma(16384, 8192, halves=True) == COOPERATIVE | PING_PONG  # forward with GELU and z: half tiles
    assert _tma(16384, 2048) == COOPERATIVE | PING_PONG  # dX
    assert _tma(2048, 8192) == COOPERATIVE | PING_PONG  # dW^T
    assert _tma(2048, 2048, batch=64) == COOPERATIVE | PING_PONG  # bmm 64 x (2048 x 2048 outputs)
    # bmm's db^T (2048 x 128 per batch): 128-wide tiles.
    assert _tma(2048, 128, batch=64) == {(256, 128, 64, 8, 3, 1)} | (PING_PONG - {(64, 256, 64, 4, 2, 2)})


def test_staging_buffer_sizes():
    """Operand stages plus one staging buffer: the whole output tile, or half of it for a split epilogue."""
    kw = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}
    assert _tma_smem(kw, 3, 2, False) == 208 * 1024 and _tma_smem(kw, 3, 2, True) == 176 * 1024
    assert _tma_smem(kw, 4, 2, True) == 224 * 1024  # the four-stage config, its epilogue always split
    pp = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}
    assert _tma_smem(pp, 2, 2, False) == 96 * 1024 and _tma_smem(pp, 2, 2, True) == 80 * 1024


def test_large_problems_on_the_portable_kernel_keep_8_warp_tiles():
    assert _portable(16384, 8192) == {
        (128, 256, 64, 8, 3, 1), (256, 128, 64, 8, 3, 1), (128, 256, 32, 8, 4, 1), (128, 128, 64, 8, 4, 1)
    }  # fmt: skip


def test_small_problems_get_small_tiles():
    assert _tma(7, 1000) == {(64, 128, 64, 4, 4, 1), (64, 256, 64, 4, 2, 2)}
    assert all(tile[0] <= 32 for tile in _portable(7, 1000))
    assert (128, 128, 64, 4, 3, 1) in _tma(1000, 768)


def test_skinny_problems_get_only_the_skinny_tiles():
    """Up to 16 rows (a decode step's tokens) the tiles are 16 rows tall and stream K in 128-256
    deep slices; from 17 rows on they are not candidates."""
    for m, n in ((1, 2048), (16, 50304), (7, 6144)):
        tiles = _portable(m, n)
        assert tiles and all(tile[0] == 16 and tile[2] >= 128 for tile in tiles), (m, n, tiles)
    assert _portable(1, 16) == {(16, 16, 256, 4, 4, 1), (16, 16, 512, 4, 4, 1)}  # none wider than the output
    assert all(tile[0] > 16 for tile in _portable(17, 2048))
    assert all(tile[0] > 16 for tile in _portable(1, 2048, element_size=4))  # fp32 keeps its 32-deep steps


def test_fp32_drops_what_does_not_fit():
    kept = _portable(4096, 4096, element_size=4)
    assert (128, 256, 64, 8, 3) not in kept and kept
    for block_m, block_n, block_k, _, stages, _ in kept:
        kw = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k}
        assert _portable_smem(kw, stages, 4) <= H100


def test_nothing_fits_falls_back_to_the_smallest():
    configs = tma_configs(interpreting=False)
    smem = lambda c: _tma_smem(c.kwargs, c.num_stages, 2, False)  # noqa: E731
    kept = _prune(configs, 4096, 4096, 1, smem, 1024, _tma_large_candidate)
    assert len(kept) == 1 and smem(kept[0]) == min(smem(c) for c in configs)


def test_grad_pass_row_split():
    """Rows per program of the elementwise pass: ~8 programs per SM, a multiple of the row tile, and
    the headline shapes leave few partial column sums to add up."""
    block_m, block_n = GRAD_TILE["BLOCK_M"], GRAD_TILE["BLOCK_N"]
    for batch, m, n in [(1, 16384, 8192), (1, 16384, 2048), (64, 2048, 2048), (1, 7, 5), (3, 1000, 4097)]:
        rows = grad_rows(batch, m, n, 132, GRAD_TILE)
        assert rows % block_m == 0 and rows >= block_m
        programs = batch * -(-m // rows) * -(-n // block_n)
        assert programs >= min(4 * 132, batch * -(-m // block_m) * -(-n // block_n))
        assert batch * -(-m // rows) <= max(256, batch)


def test_interpreter_tiles_follow_the_problem():
    """Under the interpreter: 16-wide tiles for the test suites' shapes, 64-wide beyond."""
    small, large = portable_configs(interpreting=True)
    assert interpreter_config([small, large], 65, 80) is small
    assert interpreter_config([small, large], 128, 40) is large
    assert (
        grad_tile(75, 37, interpreting=True)["BLOCK_N"] == 16
        and grad_tile(128, 512, interpreting=True)["BLOCK_N"] == 64
    )
    assert grad_tile(128, 512, interpreting=False) == GRAD_TILE


@pytest.mark.parametrize(
    "shape, expected",
    [
        ((1, 1024, 1024, 16384), 2),  # a 1024x1024 weight gradient over 16k tokens: 64 tiles for 132 SMs
        ((1, 3072, 1024, 16384), 1),  # 192 tiles: the autotuner's tiles do better unsplit (H100)
        ((1, 4096, 1024, 16384), 1),  # 256 tiles: 0.97 of two waves
        ((1, 1024, 1024, 2048), 1),  # too shallow to split
        ((1, 16384, 1024, 1024), 1),  # a forward: many tiles
        ((1, 7, 7, 100000), 1),  # one tile: a split would leave the GPU as empty
    ],
)
def test_split_k_choice(shape, expected):
    assert split_k(*shape, sms=132) == expected
