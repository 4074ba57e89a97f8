"""@triton.jit helpers shared by the matmul kernels and the activation-gradient kernel.

- Tile order: output tiles are visited in groups of GROUP_M row-tiles that sweep the columns
  together, so the B column panels and A row panels a group reads stay in L2.
- Epilogue (forward): z = acc + bias and act(z) in fp32 registers; the forward stores z too
  when a GELU trains (its backward needs act'(z)).
- Activation derivatives (backward, kernels.grad): GELU's from the saved z, ReLU's from the
  saved output (act'(z) = [y > 0]).
- Casts to the operand dtype round to nearest even, as the GPU does, also when interpreting.

The codes below are the values of the ACTIVATION constexpr.
"""

import triton
import triton.language as tl

ACT_NONE = tl.constexpr(0)
ACT_RELU = tl.constexpr(1)
ACT_GELU = tl.constexpr(2)
ACT_GELU_TANH = tl.constexpr(3)

ACTIVATION_CODES = {
    None: ACT_NONE.value,
    "relu": ACT_RELU.value,
    "gelu": ACT_GELU.value,
    "gelu_tanh": ACT_GELU_TANH.value,
}


@triton.jit
def _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of the tile_id-th output tile in grouped order (GROUP_M row-tiles per group)."""
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    in_group = tile_id % num_pid_in_group
    pid_m = first_pid_m + in_group % group_size_m
    pid_n = in_group // group_size_m
    return pid_m, pid_n


@triton.jit
def _rcp(x, INTERPRETED: tl.constexpr, PRECISE: tl.constexpr):
    """1 / x in fp32: compiled, rcp.approx.ftz (one special-function op, <= 1 ulp) where `1.0 / x`
    compiles to div.full.f32 with four more instructions of denormal range checks; the
    interpreter cannot run inline PTX and divides. PRECISE (fp32 results): one Newton step on
    top, so that an fp32 GELU gradient summed over many rows (d(bias)) keeps torch's accuracy."""
    if INTERPRETED:
        r = 1.0 / x
    else:
        r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
        if PRECISE:
            r = r + r * (1.0 - x * r)  # fused into FMAs: the residual 1 - x r is exact
    return r


@triton.jit
def _exp2(x, INTERPRETED: tl.constexpr, PRECISE: tl.constexpr):
    """2^x in fp32 for x <= 0: compiled, ex2.approx.ftz (tl.math.exp2 adds two instructions of
    denormal scaling), ~2 ulp. PRECISE (fp32 results): 2^n 2^f with n = round(x), |f| <= 1/2, 2^f
    by its Taylor series to degree 7 (relative error < 5.2e-9, under fp32 rounding) and 2^n from
    the exponent bits; below 2^-126 it flushes to zero like the .ftz instruction."""
    if INTERPRETED:
        r = tl.math.exp2(x)
    elif PRECISE:
        # round to nearest by the 1.5 * 2^23 shifter (tl.floor is not in Triton 2.2's core)
        n = (tl.maximum(x, -127.0) + 12582912.0) - 12582912.0
        f = x - n
        p = 1.5252733804059838e-05  # ln(2)^k / k!, k = 7 .. 0
        p = p * f + 0.00015403530393381606
        p = p * f + 0.0013333558146428441
        p = p * f + 0.009618129107628477
        p = p * f + 0.055504108664821576
        p = p * f + 0.2402265069591007
        p = p * f + 0.6931471805599453
        p = p * f + 1.0
        scale = ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
        r = tl.where(x < -126.0, 0.0, p * scale)
    else:
        r = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    return r


@triton.jit
def _normal_pdf_cdf(z, INTERPRETED: tl.constexpr, PRECISE: tl.constexpr):
    """(phi(z), Phi(z)) of the standard normal, fp32, from basic ops: GELU = z Phi(z), GELU' = Phi + z phi.

    Phi from phi through the Mills ratio, as Abramowitz & Stegun 26.2.17 does, one degree higher:
    with t = 1/(1 + 0.275|z|), Phi(-|z|) = phi(z) * t * P(t), P of degree 5 fitted for this
    package (weighted least squares on the Mills ratio, then Lawson reweighting toward minimax):
    |error| < 5.1e-9 on Phi, below fp32 rounding, so that gradients summed over many tokens
    (d(bias), dW) carry no systematic error (A&S's 7.5e-8, summed over the tokens of an fp32
    test, exceeded the tolerance). Phi(|z|) = 1 - Phi(-|z|): no 1 + erf cancellation for very
    negative z. About 15 instructions and two special-function ops (a reciprocal, an exp) per
    element compiled, against about 75 for libdevice's erff; no libdevice call.
    """
    t = _rcp(1.0 + 0.275 * tl.abs(z), INTERPRETED, PRECISE)
    # phi(z) = exp(-z^2/2) / sqrt(2 pi) = 2^(z^2 * -log2(e)/2 + log2(1/sqrt(2 pi))): one mul, one fma, one ex2.
    pdf = _exp2(z * z * -0.7213475204444817 - 1.3257480647361593, INTERPRETED, PRECISE)
    poly = -0.2879068620
    poly = poly * t + 1.132991917
    poly = poly * t - 0.8296765249
    poly = poly * t + 0.8370437550
    poly = poly * t + 0.1055578391
    poly = poly * t + 0.2953040247
    tail = pdf * t * poly
    cdf = tl.where(z >= 0.0, 1.0 - tail, tail)
    return pdf, cdf


@triton.jit
def _tanh_gate(z, INTERPRETED: tl.constexpr, PRECISE: tl.constexpr):
    """(s, ds) of the tanh-approximate GELU, fp32: GELU = z s, GELU' = s + z ds.

    With u = sqrt(2/pi) * (z + 0.044715 z^3): 0.5 * (1 + tanh(u)) = sigmoid(2u) = s, and
    ds = 2 s (1 - s) u'. Written with one exp of -2|u| (<= 1, never overflows) and no tanh (a
    libdevice call): s(1 - s) = t / (1 + t)^2 with t = exp(-2|u|) has no cancellation.
    Constants are folded so that t takes one mul and one ex2.
    """
    z2 = z * z
    # 2|u| log2(e) = |z (1 + 0.044715 z^2)| * 2 sqrt(2/pi) log2(e); u has the sign of z.
    t = _exp2(tl.abs(z * (1.0 + 0.044715 * z2)) * -2.302208198144325, INTERPRETED, PRECISE)
    r = _rcp(1.0 + t, INTERPRETED, PRECISE)
    s = tl.where(z >= 0.0, r, t * r)
    du = 0.7978845608028654 + 0.10703222440890037 * z2  # sqrt(2/pi) * (1 + 3 * 0.044715 z^2)
    return s, 2.0 * (t * r * r) * du


@triton.jit
def _add_bias(acc, bias_ptr, stride_bias, cols, N, HAS_BIAS: tl.constexpr):
    """z = acc + bias in fp32; bias (strided) indexes the columns `cols` (< N)."""
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols * stride_bias, mask=cols < N, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    return acc


@triton.jit
def _activation(z, ACTIVATION: tl.constexpr, INTERPRETED: tl.constexpr, PRECISE: tl.constexpr):
    """act(z) in fp32; PRECISE: full fp32 accuracy (fp32 results), else special-function ops."""
    if ACTIVATION == ACT_RELU:
        y = tl.where(z < 0.0, 0.0, z)  # NaN stays NaN, as torch.relu
    elif ACTIVATION == ACT_GELU:
        _, cdf = _normal_pdf_cdf(z, INTERPRETED, PRECISE)
        y = z * cdf
    elif ACTIVATION == ACT_GELU_TANH:
        s, _ = _tanh_gate(z, INTERPRETED, PRECISE)
        y = z * s
    else:
        y = z
    return y


@triton.jit
def _activation_grad(dy, saved, ACTIVATION: tl.constexpr, INTERPRETED: tl.constexpr, PRECISE: tl.constexpr):
    """dz = dy * act'(z), fp32: `saved` is z for the GELUs, the output y for ReLU, unused without activation."""
    if ACTIVATION == ACT_RELU:
        # torch's threshold_backward: zero where the output is <= 0 (a NaN output passes dy on).
        dz = tl.where(saved <= 0.0, 0.0, dy)
    elif ACTIVATION == ACT_GELU:
        pdf, cdf = _normal_pdf_cdf(saved, INTERPRETED, PRECISE)
        dz = dy * (cdf + saved * pdf)
    elif ACTIVATION == ACT_GELU_TANH:
        s, ds = _tanh_gate(saved, INTERPRETED, PRECISE)
        dz = dy * (s + saved * ds)
    else:
        dz = dy
    return dz


@triton.jit
def _cast(x, dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    """fp32 `x` rounded to `dtype`. The interpreter truncates fp32 -> bf16 casts where the GPU rounds
    to nearest even; when interpreting, bf16 is rounded explicitly, so that the CPU run checks the
    GPU's numerics."""
    if INTERPRETED:
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
            x = tl.where(x != x, x, rounded)  # NaN stays NaN
    return x.to(dtype)
