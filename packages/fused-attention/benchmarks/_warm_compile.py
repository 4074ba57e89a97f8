"""Compile, into Triton's on-disk cache, the attention kernels a benchmark combination will autotune.

    python _warm_compile.py HEAD_DIM CAUSAL ALIBI DETERMINISTIC DIRECTION   (0/1 flags; fwd or bwd)
    python _warm_compile.py flex BATCH HEADS SEQLEN HEAD_DIM                 (compiled flex_attention)

bench_attention.py starts one process per combination before it measures anything, so the
compiles (seconds each, several per combination) run side by side instead of one after another
in the benchmark process, whose autotuning then loads them from the cache. Tiny inputs give the
benchmark's specializations: sizes are not specialized, and the strides (multiples of 16) and
pointer alignment are the same. Each candidate config is launched once, explicitly (no timing
runs on the shared GPU). The flex mode runs flex_attention's forward and backward at the
benchmark's shape, in both set-ups (block mask or causal in the score_mod), so that
Inductor's caches hold them.
"""

import sys

import torch


def warm_ours(head_dim: int, causal: bool, alibi: bool, deterministic: bool, direction: str) -> None:
    from fused_attention import alibi_slopes
    from fused_attention.ops.configs import candidate_configs
    from fused_attention.ops.launch import AttentionSpec, _tma_by_default, attention_bwd, attention_fwd

    batch, seqlen, heads = 1, 256, 2
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    slopes = alibi_slopes(heads, device="cuda") if alibi else None
    spec = AttentionSpec(
        batch, heads, heads, head_dim, seqlen, seqlen, head_dim**-0.5, -1, 0 if causal else -1, alibi, False, False,
        deterministic,
    )  # fmt: skip
    tma = _tma_by_default(q.device)
    if direction == "fwd":
        for config in candidate_configs("fwd", head_dim, tma):
            attention_fwd(q, k, v, slopes, None, None, spec, config)
    else:
        out, lse = torch.randn_like(q), torch.zeros(batch, heads, seqlen, device="cuda")
        dkdv_configs, dq_configs = candidate_configs("dkdv", head_dim, tma), candidate_configs("dq", head_dim, tma)
        for config in dkdv_configs:
            attention_bwd(out, q, k, v, out, lse, None, slopes, None, None, spec, config, dq_configs[0])
        for config in dq_configs[1:] if deterministic else ():
            attention_bwd(out, q, k, v, out, lse, None, slopes, None, None, spec, dkdv_configs[0], config)
    torch.cuda.synchronize()


def warm_flex(batch: int, heads: int, seqlen: int, head_dim: int) -> None:
    from bench_attention import _flex_alibi

    q, k, v = (
        torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    for block_mask in (True, False):
        fn = _flex_alibi(heads, block_mask)
        with torch.no_grad():
            fn(q, k, v)
        fn(q, k, v).sum().backward()
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1] == "flex":
        warm_flex(*map(int, sys.argv[2:6]))
    else:
        head_dim, causal, alibi, deterministic = map(int, sys.argv[1:5])
        warm_ours(head_dim, bool(causal), bool(alibi), bool(deterministic), sys.argv[5])
