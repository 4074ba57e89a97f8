"""@triton.jit helpers shared by the portable and the TMA matmul kernels.

- Tile order: output tiles are visited in groups of GROUP_M row-tiles that sweep the columns
  together, so the B column panels and A row panels a group reads stay in L2.
- Prologue (backward only): the A operand is scaled as it is loaded, dZ = dY * act'(Z), from
  the derivative the forward saved (GELU) or from the saved output (ReLU: act'(Z) = [Y > 0]).
- Epilogue: bias, activation and, when the forward saves for backward, act'(Z), computed in
  fp32 registers from the accumulator.
- Casts to the operand dtype round to nearest even, as the GPU does, also when interpreting.

The codes below are the values of the PROLOGUE and ACTIVATION constexprs.
"""

import triton
import triton.language as tl

# ACTIVATION
ACT_NONE = tl.constexpr(0)
ACT_RELU = tl.constexpr(1)
ACT_GELU = tl.constexpr(2)
ACT_GELU_TANH = tl.constexpr(3)
# PROLOGUE
PRO_NONE = tl.constexpr(0)
PRO_MUL = tl.constexpr(1)  # A * S: S holds act'(Z)
PRO_RELU_MASK = tl.constexpr(2)  # A where S > 0: S holds relu(Z)

# The GELU derivatives span [-0.17, 1.13]; saved as 7/8 of their value they stay below 1, where
# bf16/fp16 spacing is half as coarse as in [1, 2): half the rounding error on the saved derivative.
SAVED_GRAD_SCALE = tl.constexpr(0.875)

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
def _gelu_and_grad(z):
    """Exact GELU z * Phi(z) and its derivative Phi(z) + z * phi(z), fp32, from basic ops.

    Phi from phi (Abramowitz & Stegun 26.2.17, |error| < 7.5e-8): with t = 1/(1 + p|z|),
    Phi(-|z|) = phi(z) * t * (b1 + t*(b2 + t*(b3 + t*(b4 + t*b5)))), Phi(|z|) = 1 - Phi(-|z|).
    The exp of phi serves GELU and its derivative alike: about 20 instructions and two
    special-function ops (a reciprocal, an exp) per element, against about 75 (compiled) for
    0.5 * (1 + libdevice erff) and the exp. No 1 + erf cancellation for very negative z, and no
    libdevice call, so the interpreter runs the same code.
    """
    t = 1.0 / (1.0 + 0.2316419 * tl.abs(z))
    # phi(z) = exp(-z^2/2) / sqrt(2 pi) = 2^(z^2 * -log2(e)/2 + log2(1/sqrt(2 pi))): one mul, one fma, one ex2.
    pdf = tl.math.exp2(z * z * -0.7213475204444817 - 1.3257480647361593)
    tail = pdf * t * (0.319381530 + t * (-0.356563782 + t * (1.781477937 + t * (-1.821255978 + t * 1.330274429))))
    cdf = tl.where(z >= 0.0, 1.0 - tail, tail)
    return z * cdf, cdf + z * pdf


@triton.jit
def _gelu_tanh_and_grad(z):
    """tanh-approximate GELU and its derivative, fp32.

    With u = sqrt(2/pi) * (z + 0.044715 z^3): 0.5 * (1 + tanh(u)) = sigmoid(2u) = s, and
    d/dz = s + 2 z s (1 - s) u'. Written with one exp of -2|u| (<= 1, never overflows) and no
    tanh (a libdevice call): s(1 - s) = t / (1 + t)^2 with t = exp(-2|u|) has no cancellation.
    Constants are folded so that t takes one mul and one ex2.
    """
    z2 = z * z
    # 2|u| log2(e) = |z (1 + 0.044715 z^2)| * 2 sqrt(2/pi) log2(e); u has the sign of z.
    t = tl.math.exp2(tl.abs(z * (1.0 + 0.044715 * z2)) * -2.302208198144325)
    r = 1.0 / (1.0 + t)
    s = tl.where(z >= 0.0, r, t * r)
    du = 0.7978845608028654 + 0.10703222440890037 * z2  # sqrt(2/pi) * (1 + 3 * 0.044715 z^2)
    return z * s, s + 2.0 * z * (t * r * r) * du


@triton.jit
def _bias_activation(acc, bias_ptr, stride_bias, cols, N, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """(act(acc + bias), act'(acc + bias)) in fp32; bias (strided) indexes the columns `cols` (< N)."""
    z = acc
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols * stride_bias, mask=cols < N, other=0.0).to(tl.float32)
        z = z + bias[None, :]
    if ACTIVATION == ACT_RELU:
        # NaN stays NaN, as torch.relu.
        y = tl.where(z < 0.0, 0.0, z)
        grad = y
    elif ACTIVATION == ACT_GELU:
        y, grad = _gelu_and_grad(z)
        grad = grad * SAVED_GRAD_SCALE
    elif ACTIVATION == ACT_GELU_TANH:
        y, grad = _gelu_tanh_and_grad(z)
        grad = grad * SAVED_GRAD_SCALE
    else:
        y = z
        grad = z
    return y, grad


@triton.jit
def _scale_operand(a, s, PROLOGUE: tl.constexpr):
    """The loaded A tile after the prologue, in fp32: dY * act'(Z), dY masked by relu(Z) > 0, or dY."""
    a = a.to(tl.float32)
    if PROLOGUE == PRO_MUL:
        a = a * (s.to(tl.float32) * (1.0 / SAVED_GRAD_SCALE))
    elif PROLOGUE == PRO_RELU_MASK:
        # torch's threshold_backward: zero where the output is <= 0 (a NaN output passes dY on).
        a = tl.where(s.to(tl.float32) <= 0.0, 0.0, a)
    return a


@triton.jit
def _cast(x, dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    """fp32 `x` rounded to `dtype`. The interpreter truncates fp32 -> bf16 casts where the GPU rounds
    to nearest even; when interpreting, bf16 is rounded explicitly, so that the CPU run checks the
    GPU's numerics (a truncation bias would build up through the saved derivative and dZ)."""
    if INTERPRETED:
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
            x = tl.where(x != x, x, rounded)  # NaN stays NaN
    return x.to(dtype)
