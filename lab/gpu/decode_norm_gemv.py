"""Lab: the residual add + RMSNorm folded into the qkv GEMV of a batch-1 decode step.

    r = h + residual (rounded to the residual's dtype, as add_dropout_norm stores it)
    x = r * rsqrt(mean(r^2) + eps) * norm_weight (rounded to h's dtype, as add_dropout_norm writes it)
    y = x @ W^T + bias                                (W (N, K) rows contiguous, as fused-gemm's GEMV)

Every program computes the row's sum of squares itself (the whole row in one load: K <= 8192),
program 0 also writes r for the next residual, then the program streams its BLOCK_N rows of W as
kernels/gemv.py does, normalizing each chunk of the row as it goes (from L1/L2). Its first weight
chunk is loaded before the sum of squares, so that load's latency overlaps it.

    TRITON_INTERPRET=1 python3 lab/gpu/decode_norm_gemv.py     (the CPU check against torch)

decode_norm_bound.py times the model's decode step with it in place of each block's attention-side
add + norm kernel. Not shipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_norm_gemv_kernel(
    h_ptr, res_ptr, res_out_ptr, norm_w_ptr, w_ptr, bias_ptr, c_ptr,
    stride_wn, N, K, eps,
    HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ROW: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    w_next = tl.load(w_ptrs, mask=col_in[:, None] & (offs_k < K)[None, :], other=0.0)
    # The whole row once: its sum of squares (program 0 writes r).
    row = tl.arange(0, ROW)
    row_in = row < K
    r = tl.load(h_ptr + row, mask=row_in, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = r + tl.load(res_ptr + row, mask=row_in, other=0.0).to(tl.float32)
        r = r.to(res_out_ptr.dtype.element_ty)
        if pid == 0:
            tl.store(res_out_ptr + row, r, mask=row_in)
        r = r.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(r * r, axis=0) / K + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k in range(0, K, BLOCK_K):
        w = w_next
        kk = k + offs_k
        k_in = kk < K
        nxt = kk + BLOCK_K
        w_next = tl.load(w_ptrs + (k + BLOCK_K), mask=col_in[:, None] & (nxt < K)[None, :], other=0.0)
        x = tl.load(h_ptr + kk, mask=k_in, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            x = (x + tl.load(res_ptr + kk, mask=k_in, other=0.0).to(tl.float32)).to(res_out_ptr.dtype.element_ty)
            x = x.to(tl.float32)
        x = x * rstd * tl.load(norm_w_ptr + kk, mask=k_in, other=0.0).to(tl.float32)
        x = x.to(h_ptr.dtype.element_ty).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
    z = tl.sum(acc, 1)
    if HAS_BIAS:
        z += tl.load(bias_ptr + cols, mask=col_in, other=0.0).to(tl.float32)
    tl.store(c_ptr + cols, z.to(c_ptr.dtype.element_ty), mask=col_in)


def add_norm_gemv(h, residual, norm_weight, eps, weight, bias=None):
    """(y, r) for one row h (..., K) (and residual of its shape, or None: r = h), weight (N, K)."""
    k = h.shape[-1]
    n = weight.shape[0]
    assert h.numel() == k and weight.stride(1) == 1 and h.is_contiguous() and k <= 8192
    res_out = h if residual is None else torch.empty_like(residual)
    y = torch.empty((*h.shape[:-1], n), dtype=h.dtype, device=h.device)
    block_n = 4 if n <= 4096 else 8
    block_k = min(512, triton.next_power_of_2(k))
    _add_norm_gemv_kernel[(triton.cdiv(n, block_n),)](
        h, h if residual is None else residual, res_out, norm_weight, weight, weight if bias is None else bias, y,
        weight.stride(0), n, k, eps, HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None, BLOCK_N=block_n,
        BLOCK_K=block_k, ROW=triton.next_power_of_2(k), num_warps=4, num_stages=1,
    )  # fmt: skip
    return y, res_out


def reference(h, residual, norm_weight, eps, weight, bias=None):
    """The same in torch ops, rounded where add_dropout_norm and the GEMV round."""
    r = h if residual is None else (h.float() + residual.float()).to(residual.dtype)
    x = (r.float() * torch.rsqrt(r.float().square().mean(-1, keepdim=True) + eps) * norm_weight.float()).to(h.dtype)
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(h.dtype), r


def check() -> None:
    """Against `reference`: odd sizes, with and without residual and bias, bf16 and an fp32 residual."""
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for k, n, residual_dtype, bias in [(2048, 6144, torch.bfloat16, False), (1000, 37, torch.float32, True),
                                       (96, 130, None, True), (513, 9, torch.bfloat16, False)]:  # fmt: skip
        h = torch.randn(1, 1, k, device=device).bfloat16()
        residual = None if residual_dtype is None else torch.randn(1, 1, k, device=device).to(residual_dtype)
        norm_weight = (1 + 0.1 * torch.randn(k, device=device)).bfloat16()
        weight = (torch.randn(n, k, device=device) / k**0.5).bfloat16()
        b = torch.randn(n, device=device).bfloat16() if bias else None
        y, r = add_norm_gemv(h, residual, norm_weight, 1e-5, weight, b)
        y_ref, r_ref = reference(h, residual, norm_weight, 1e-5, weight, b)
        if device == "cuda":
            assert torch.equal(r, r_ref), (k, n)
        else:  # the interpreter truncates fp32 -> bf16 casts where the GPU rounds: one ulp apart at most
            torch.testing.assert_close(r, r_ref, rtol=2**-7, atol=0)
        err = (y.float() - y_ref.float()).abs().max().item()
        tol = 4 * y_ref.float().abs().max().item() * 2**-8  # four bf16 half-ulps of the largest output
        assert err <= tol, (k, n, err, tol)
        print(f"K {k} N {n} residual {residual_dtype} bias {bias}: max error {err:.3g} (bound {tol:.3g})")


if __name__ == "__main__":
    check()
