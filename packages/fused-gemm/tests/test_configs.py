"""The autotune candidates each problem gets after pruning (no kernel runs): what fits and what suits the size."""

from fused_gemm._compat import H100_SHARED_MEMORY_PER_BLOCK
from fused_gemm.kernels.configs import (
    _portable_large_candidate,
    _portable_smem,
    _prune,
    _tma_large_candidate,
    _tma_smem,
    portable_configs,
    tma_configs,
)

H100 = H100_SHARED_MEMORY_PER_BLOCK


def _tiles(configs):
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, programs per SM) of each config."""
    return {
        (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages,
         c.kwargs.get("PROGRAMS_PER_SM", 1))
        for c in configs
    }  # fmt: skip


def _tma(m, n, batch=1, prologue=False, row_sum=False, c_trans=False):
    configs = tma_configs(interpreting=False)
    smem = lambda c: _tma_smem(c.kwargs, c.num_stages, 2, prologue, row_sum, batch > 1 and not c_trans)  # noqa: E731
    return _tiles(_prune(configs, m, n, batch, smem, H100, _tma_large_candidate))


def _portable(m, n, element_size=2, prologue=False):
    configs = portable_configs(interpreting=False)
    smem = lambda c: _portable_smem(c.kwargs, c.num_stages, element_size, prologue)  # noqa: E731
    return _tiles(_prune(configs, m, n, 1, smem, H100, _portable_large_candidate))


def test_issue_shapes_keep_the_large_hopper_tiles():
    """As compiled by Triton 3.6 for sm_90 (configs module docstring): what fits each variant."""
    forward = _tma(16384, 8192)
    cooperative = {(128, 256, 64, 8, 3, 1), (128, 256, 32, 8, 4, 1), (256, 128, 64, 8, 3, 1)}
    ping_pong = {(128, 128, 64, 4, 2, 2), (64, 256, 64, 4, 2, 2)}
    assert forward == cooperative | ping_pong
    # dX: the prologue's S tile pushes 256x128x64 to 240 KB.
    assert _tma(16384, 2048, prologue=True) == forward - {(256, 128, 64, 8, 3, 1)}
    # dW with d(bias): the row sums push 128x256x64 to 228 KB and 64x256 past half an SM.
    dw = _tma(2048, 8192, prologue=True, row_sum=True)
    assert dw == {(128, 256, 32, 8, 4, 1), (128, 128, 64, 4, 2, 2)}
    # bmm 64 x (2048 x 2048 outputs): large in total; its 3-D output store needs half a tile more.
    assert _tma(2048, 2048, batch=64) == {(128, 256, 32, 8, 4, 1), (128, 128, 64, 4, 2, 2)}
    # bmm's db^T (2048 x 128 per batch, transposed store, row sums): 128-wide tiles.
    assert _tma(2048, 128, batch=64, row_sum=True, c_trans=True) == {(256, 128, 64, 8, 3, 1), (128, 128, 64, 4, 2, 2)}


def test_large_problems_on_the_portable_kernel_keep_8_warp_tiles():
    assert _portable(16384, 8192) == {
        (128, 256, 64, 8, 3, 1), (256, 128, 64, 8, 3, 1), (128, 256, 32, 8, 4, 1), (128, 128, 64, 8, 4, 1)
    }  # fmt: skip


def test_small_problems_get_small_tiles():
    assert _tma(7, 1000) == {(64, 128, 64, 4, 4, 1), (64, 256, 64, 4, 2, 2)}
    assert all(tile[0] <= 32 for tile in _portable(7, 1000))
    assert (128, 128, 64, 4, 3, 1) in _tma(1000, 768)


def test_fp32_drops_what_does_not_fit():
    kept = _portable(4096, 4096, element_size=4)
    assert (128, 256, 64, 8, 3) not in kept and kept
    for block_m, block_n, block_k, _, stages, _ in kept:
        kw = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k}
        assert _portable_smem(kw, stages, 4, False) <= H100


def test_nothing_fits_falls_back_to_the_smallest():
    configs = tma_configs(interpreting=False)
    smem = lambda c: _tma_smem(c.kwargs, c.num_stages, 2, True, True, False)  # noqa: E731
    kept = _prune(configs, 4096, 4096, 1, smem, 1024, _tma_large_candidate)
    assert len(kept) == 1 and smem(kept[0]) == min(smem(c) for c in configs)
