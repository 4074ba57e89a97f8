"""Lab: the residual add + RMSNorm folded into the products of a batch-1 decode step.

    r = h + residual (rounded to the residual's dtype, as add_dropout_norm stores it)
    x = r * rsqrt(mean(r^2) + eps) * norm_weight (rounded to h's dtype, as add_dropout_norm writes it)
    y = x @ W^T + bias                                (W (N, K) rows contiguous, as fused-gemm's GEMV)

Every program computes the row's sum of squares itself (the whole row in one load: K <= 8192),
program 0 also writes r for the next residual, then the program streams its BLOCK_N rows of W as
kernels/gemv.py does, normalizing each chunk of the row as it goes (from L1/L2). Its first weight
chunk is loaded before the sum of squares, so that load's latency overlaps it.

The MLP side, `add_norm_swiglu`: the same prologue in a copy of fused-swiglu's tiled gate/up
kernel (weights input-major, (K, N) with N contiguous, which a row GEMV does not serve; the
column GEMVs tried instead lost to that kernel), one row of BLOCK_M live, at the tile the
package's autotuner picked for the row.

    TRITON_INTERPRET=1 python3 lab/gpu/decode_norm_gemv.py     (the CPU check against torch)

decode_norm_bound.py times the model's decode step with it in place of each block's attention-side
add + norm kernel. Not shipped.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from fused_swiglu.kernels.activation import SILU, _swiglu


@triton.jit
def _row_rstd(h_ptr, res_ptr, res_out_ptr, K, eps, HAS_RESIDUAL: tl.constexpr, ROW: tl.constexpr):
    """rsqrt(mean(r^2) + eps) of the row r = h + residual, from one whole-row load; program 0
    writes r (rounded to the residual's dtype, the value the norm sees)."""
    row = tl.arange(0, ROW)
    row_in = row < K
    r = tl.load(h_ptr + row, mask=row_in, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = r + tl.load(res_ptr + row, mask=row_in, other=0.0).to(tl.float32)
        r = r.to(res_out_ptr.dtype.element_ty)
        if tl.program_id(0) == 0:
            tl.store(res_out_ptr + row, r, mask=row_in)
        r = r.to(tl.float32)
    return 1.0 / tl.sqrt(tl.sum(r * r, axis=0) / K + eps)


@triton.jit
def _normalized(h_ptr, res_ptr, res_out_ptr, norm_w_ptr, kk, k_in, rstd, HAS_RESIDUAL: tl.constexpr):
    """Elements kk of the normalized row, rounded to h's dtype as add_dropout_norm writes x (fp32)."""
    x = tl.load(h_ptr + kk, mask=k_in, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x = (x + tl.load(res_ptr + kk, mask=k_in, other=0.0).to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        x = x.to(tl.float32)
    x = x * rstd * tl.load(norm_w_ptr + kk, mask=k_in, other=0.0).to(tl.float32)
    return x.to(h_ptr.dtype.element_ty).to(tl.float32)


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
    rstd = _row_rstd(h_ptr, res_ptr, res_out_ptr, K, eps, HAS_RESIDUAL, ROW)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k in range(0, K, BLOCK_K):
        w = w_next
        kk = k + offs_k
        k_in = kk < K
        nxt = kk + BLOCK_K
        w_next = tl.load(w_ptrs + (k + BLOCK_K), mask=col_in[:, None] & (nxt < K)[None, :], other=0.0)
        x = _normalized(h_ptr, res_ptr, res_out_ptr, norm_w_ptr, kk, k_in, rstd, HAS_RESIDUAL)
        acc += w.to(tl.float32) * x[None, :]
    z = tl.sum(acc, 1)
    if HAS_BIAS:
        z += tl.load(bias_ptr + cols, mask=col_in, other=0.0).to(tl.float32)
    tl.store(c_ptr + cols, z.to(c_ptr.dtype.element_ty), mask=col_in)


@triton.jit
def _add_norm_swiglu_kernel(
    h_ptr, res_ptr, res_out_ptr, norm_w_ptr, wg_ptr, wu_ptr, out_ptr,
    stride_wk, N, K, eps,
    HAS_RESIDUAL: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, ROW: tl.constexpr,
):  # fmt: skip
    """silu(x @ Wg) * (x @ Wu) for the one row x = RMSNorm(h + residual), Wg and Wu (K, N)."""
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    offs_k = tl.arange(0, BLOCK_K)
    rstd = _row_rstd(h_ptr, res_ptr, res_out_ptr, K, eps, HAS_RESIDUAL, ROW)
    live = (tl.arange(0, BLOCK_M) == 0)[:, None]  # the tile's one real row
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        kk = k + offs_k
        k_in = kk < K
        x = _normalized(h_ptr, res_ptr, res_out_ptr, norm_w_ptr, kk, k_in, rstd, HAS_RESIDUAL)
        a = tl.where(live, x[None, :], 0.0).to(h_ptr.dtype.element_ty)
        w_offs = kk.to(tl.int64)[:, None] * stride_wk + cols[None, :]
        w_mask = k_in[:, None] & col_in[None, :]
        wg = tl.load(wg_ptr + w_offs, mask=w_mask, other=0.0)
        wu = tl.load(wu_ptr + w_offs, mask=w_mask, other=0.0)
        if UPCAST:  # the interpreter's bf16 dots run on raw bits
            acc_g += tl.dot(a.to(tl.float32), wg.to(tl.float32))
            acc_u += tl.dot(a.to(tl.float32), wu.to(tl.float32))
        else:
            acc_g = tl.dot(a, wg, acc_g)
            acc_u = tl.dot(a, wu, acc_u)
    out = _swiglu(acc_g, acc_u, SILU)
    tl.store(out_ptr + cols[None, :] + 0 * tl.arange(0, BLOCK_M)[:, None], out.to(out_ptr.dtype.element_ty),
             mask=live & col_in[None, :])  # fmt: skip


def add_norm_swiglu(h, residual, norm_weight, eps, w_gate, w_up, block_n=64, block_k=64, num_warps=4, num_stages=3):
    """(silu(x @ w_gate) * (x @ w_up), r) for one row h (..., K), x = RMSNorm(h + residual) as in
    add_norm_gemv, w_gate and w_up (K, N) with N contiguous."""
    k, n = w_gate.shape
    assert h.numel() == k and h.is_contiguous() and w_gate.stride() == w_up.stride() and w_gate.stride(1) == 1
    res_out = h if residual is None else torch.empty_like(residual)
    out = torch.empty((*h.shape[:-1], n), dtype=h.dtype, device=h.device)
    _add_norm_swiglu_kernel[(triton.cdiv(n, block_n),)](
        h, h if residual is None else residual, res_out, norm_weight, w_gate, w_up, out, w_gate.stride(0), n, k, eps,
        HAS_RESIDUAL=residual is not None, UPCAST=os.environ.get("TRITON_INTERPRET") == "1", BLOCK_M=16,
        BLOCK_N=block_n, BLOCK_K=block_k, ROW=triton.next_power_of_2(k), num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out, res_out


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


def reference_swiglu(h, residual, norm_weight, eps, w_gate, w_up):
    """add_norm_swiglu in torch ops, rounded where add_dropout_norm and fused-swiglu round."""
    r = h if residual is None else (h.float() + residual.float()).to(residual.dtype)
    x = (r.float() * torch.rsqrt(r.float().square().mean(-1, keepdim=True) + eps) * norm_weight.float()).to(h.dtype)
    g, u = x.float() @ w_gate.float(), x.float() @ w_up.float()
    return (torch.nn.functional.silu(g) * u).to(h.dtype), r


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
        w_gate, w_up = ((torch.randn(k, n, device=device) / k**0.5).bfloat16() for _ in range(2))
        out, r = add_norm_swiglu(h, residual, norm_weight, 1e-5, w_gate, w_up)
        out_ref, r_ref = reference_swiglu(h, residual, norm_weight, 1e-5, w_gate, w_up)
        err = (out.float() - out_ref.float()).abs().max().item()
        tol = 4 * out_ref.float().abs().max().item() * 2**-8
        assert err <= tol, ("swiglu", k, n, err, tol)
        print(f"  swiglu K {k} N {n}: max error {err:.3g} (bound {tol:.3g})")


if __name__ == "__main__":
    check()
