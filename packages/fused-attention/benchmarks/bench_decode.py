"""Decoding against a KV cache: `flash_attention_with_kvcache` against SDPA's decode over the same
cache, bf16, one new token per row, timed in turn (interleaved rounds) at each point.

Points: batch 1 and 16, 32 query heads over 8 KV heads (GQA 4:1), D = 128, caches of 4096 to
32768 positions, full. Bytes: the K and V cache rows read, 2 * B * L * H_kv * D * 2, so GB/s is
the cache's read rate; compare it with the GPU's copy ceiling. do_bench flushes L2 between calls,
so every call reads its cache from HBM, as in a model's decode step. The `kernels ms` column is
the kernels' own time (profiler) without the host; at short caches the eager time is close to
it plus a launch.
"""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit.bench import OURS, measure_paired

from fused_attention import flash_attention_with_kvcache

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
LENGTHS = (4096, 8192, 16384, 32768)


@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("length", LENGTHS)
def test_decode(benchmark, batch, length):
    options = dict(device="cuda", dtype=torch.bfloat16)
    k_cache = torch.randn(batch, length, KV_HEADS, HEAD_DIM, **options)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, 1, HEADS, HEAD_DIM, **options)
    lengths = torch.full((batch,), length, dtype=torch.int32, device="cuda")

    def ours():
        return flash_attention_with_kvcache(q, k_cache, v_cache, lengths)

    def sdpa():  # GQA heads shared without copies (enable_gqa, torch >= 2.5)
        return F.scaled_dot_product_attention(
            q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), enable_gqa=True
        ).transpose(1, 2)

    with torch.no_grad():
        torch.testing.assert_close(ours(), sdpa(), atol=2e-2, rtol=2e-2)
        measure_paired(
            benchmark, group="decode B=1" if batch == 1 else f"decode B={batch}",
            shape=f"{length} positions, {HEADS}/{KV_HEADS} heads, D {HEAD_DIM}",
            fns={OURS: ours, "torch SDPA": sdpa}, bytes=2 * batch * length * KV_HEADS * HEAD_DIM * 2,
        )  # fmt: skip
