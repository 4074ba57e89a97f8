"""Bad input raises a clear TypeError / ValueError naming the argument, before any launch."""

import pytest
import torch

from fused_swiglu import FastAccumFusedSwiGLU, FusedSwiGLU, FusedSwiGLUMLP, SwiGLU, SwiGLUMLP, swiglu, swiglu_mlp


def _inputs(dtype=torch.bfloat16, d_model=8, d_inter=12):
    return (
        torch.ones(3, d_model, dtype=dtype),
        torch.ones(d_model, d_inter, dtype=dtype),
        torch.ones(d_model, d_inter, dtype=dtype),
    )


@pytest.mark.parametrize("fn", [swiglu, FusedSwiGLU.apply])
def test_rejects_integer_dtype(fn):
    x, wg, wu = _inputs()
    with pytest.raises(TypeError, match=r"^x has dtype torch.int64; supported: float32, float16, bfloat16"):
        fn(x.long(), wg, wu)


def test_rejects_mixed_dtypes():
    x, wg, wu = _inputs()
    with pytest.raises(TypeError, match=r"^w_up has dtype torch.float16 but x has torch.bfloat16"):
        swiglu(x, wg, wu.half())


def test_rejects_non_tensor():
    x, wg, wu = _inputs()
    with pytest.raises(TypeError, match=r"^w_gate must be a torch.Tensor, got list"):
        swiglu(x, [[1.0]], wu)


def test_fast_accum_takes_fp16_only():
    x, wg, wu = _inputs(torch.bfloat16)
    with pytest.raises(TypeError, match=r"^x has dtype torch.bfloat16; supported: float16$"):
        FastAccumFusedSwiGLU.apply(x, wg, wu, True)


def test_fast_accum_flag_must_be_bool():
    x, wg, wu = _inputs(torch.float16)
    with pytest.raises(TypeError, match=r"^fp16_accumulate must be a bool, got str"):
        FastAccumFusedSwiGLU.apply(x, wg, wu, "yes")


def test_rejects_weight_with_wrong_d_model():
    x, _, wu = _inputs()
    with pytest.raises(
        ValueError, match=r"^w_gate has shape \(9, 12\); expected \(8, d_intermediate >= 1\) \(d_model = 8\)"
    ):
        swiglu(x, torch.ones(9, 12, dtype=x.dtype), wu)


def test_rejects_mismatched_up_weight():
    x, wg, _ = _inputs()
    with pytest.raises(ValueError, match=r"^w_up has shape \(8, 13\); expected \(8, 12\)"):
        swiglu(x, wg, torch.ones(8, 13, dtype=x.dtype))


def test_rejects_1d_weight():
    x, _, wu = _inputs()
    with pytest.raises(ValueError, match=r"^w_gate must be 2-D"):
        swiglu(x, torch.ones(8, dtype=x.dtype), wu)


def test_rejects_empty_intermediate():
    x = torch.ones(3, 8, dtype=torch.bfloat16)
    w = torch.ones(8, 0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^w_gate has shape \(8, 0\)"):
        swiglu(x, w, w)


def test_rejects_0d_and_empty_model_dim():
    _, wg, wu = _inputs()
    with pytest.raises(ValueError, match=r"^x must have at least 1 dim"):
        swiglu(torch.tensor(1.0, dtype=torch.bfloat16), wg, wu)
    with pytest.raises(ValueError, match=r"^x has shape \(3, 0\): d_model"):
        swiglu(torch.ones(3, 0, dtype=torch.bfloat16), wg, wu)


def test_rejects_one_bias_or_wrong_bias_shape():
    x, wg, wu = _inputs()
    with pytest.raises(ValueError, match=r"^b_gate and b_up must be given together"):
        swiglu(x, wg, wu, torch.ones(12, dtype=x.dtype))
    with pytest.raises(ValueError, match=r"^b_up has shape \(11,\); expected \(12,\)"):
        swiglu(x, wg, wu, torch.ones(12, dtype=x.dtype), torch.ones(11, dtype=x.dtype))


def test_mlp_rejects_bad_down_projection():
    x, wg, wu = _inputs()
    with pytest.raises(ValueError, match=r"^w_down has shape \(8, 12\); expected \(d_intermediate, d_out\)"):
        swiglu_mlp(x, wg, wu, torch.ones(8, 12, dtype=x.dtype))
    with pytest.raises(ValueError, match=r"^b_down has shape \(7,\); expected \(8,\)"):
        swiglu_mlp(x, wg, wu, torch.ones(12, 8, dtype=x.dtype), None, None, torch.ones(7, dtype=x.dtype))
    with pytest.raises(TypeError, match=r"^w_down has dtype torch.float32 but x has torch.bfloat16"):
        swiglu_mlp(x, wg, wu, torch.ones(12, 8))


def test_rejects_wrong_device():
    """Meta tensors are on neither the CPU nor CUDA: the device check, last, names x."""
    x, wg, wu = (t.to("meta") for t in _inputs())
    with pytest.raises(ValueError, match=r"^x is on meta"):
        swiglu(x, wg, wu)


@pytest.mark.parametrize("activation", ["gelu", "relu", None, 1], ids=str)
@pytest.mark.parametrize(
    "call", ["swiglu", "FusedSwiGLU", "FastAccumFusedSwiGLU", "swiglu_mlp", "FusedSwiGLUMLP", "SwiGLU", "SwiGLUMLP"]
)
def test_rejects_unknown_activation(call, activation):
    """Checked first, before the device (meta tensors): the error names the argument and what it takes."""
    x, wg, wu = (t.to("meta") for t in _inputs(torch.float16))
    x.requires_grad_()  # through the autograd Functions
    wd = torch.ones(12, 8, dtype=x.dtype, device="meta")
    calls = {
        "swiglu": lambda: swiglu(x, wg, wu, activation=activation),
        "FusedSwiGLU": lambda: FusedSwiGLU.apply(x, wg, wu, None, None, activation),
        "FastAccumFusedSwiGLU": lambda: FastAccumFusedSwiGLU.apply(x, wg, wu, False, None, None, activation),
        "swiglu_mlp": lambda: swiglu_mlp(x, wg, wu, wd, activation=activation),
        "FusedSwiGLUMLP": lambda: FusedSwiGLUMLP.apply(x, wg, wu, wd, None, None, None, activation),
        "SwiGLU": lambda: SwiGLU(8, 12, activation=activation),
        "SwiGLUMLP": lambda: SwiGLUMLP(8, 12, activation=activation),
    }
    with pytest.raises(ValueError, match=rf"^activation={activation!r} is not one of 'silu', 'gelu_tanh'$"):
        calls[call]()
