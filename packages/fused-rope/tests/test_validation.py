"""Bad input raises a clear TypeError / ValueError naming the argument, before any launch.

Shape and dtype checks run on meta tensors (no data, so they run on every machine, and the
device check, last, is what a meta tensor fails); the value checks of index tensors need
their data on the kernel device, with the launch replaced by a tripwire.
"""

import pytest
import torch

import fused_rope.ops.rope as rope_ops
import fused_rope.ops.rope_qk as rope_qk_ops
from fused_rope import RotaryEmbedding, apply_rotary_pos_emb, apply_rotary_qk

META = "meta"


def meta(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device=META)


T = meta(5, 2, 3, 16)  # sbhd: seq 5, batch 2, heads 3, head_dim 16
FREQS = meta(8, 1, 1, 16)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(t=[1.0]), TypeError, r"^t must be a torch.Tensor, got list"),
        (dict(t=meta(5, 2, 3, 16, dtype=torch.int32)), TypeError, r"^t has dtype torch.int32; supported: float32"),
        (dict(freqs=meta(8, 1, 1, 16, dtype=torch.int64)), TypeError, r"^freqs has dtype torch.int64"),
        (dict(tensor_format="hbsd"), ValueError, r"^tensor_format must be one of 'sbhd', 'bshd', 'thd', got 'hbsd'"),
        (dict(interleaved=1), TypeError, r"^interleaved must be a bool, got int"),
        # TE >= 2.2's positional order (t, freqs, tensor_format, start_positions, interleaved, ...)
        (dict(interleaved=meta(2, dtype=torch.int32)), TypeError,
         r"^interleaved \(the fourth argument\) must be a bool, got Tensor; TransformerEngine's fourth argument "
         r"is start_positions: pass start_positions= by keyword$"),
        (dict(interleaved=None), TypeError, r"^interleaved \(the fourth argument\) must be a bool, got NoneType"),
        (dict(start_positions=meta(2)), TypeError, r"^start_positions has dtype torch.float32"),
        (dict(t=meta(5, 2, 16)), ValueError,
         r"^t must have 4 dims, \(s, b, h, d\) for tensor_format='sbhd'; got shape \(5, 2, 16\)"),
        (dict(freqs=meta(8, 1, 16)), ValueError, r"^freqs must have 4 or 2 dims"),
        (dict(freqs=meta(8, 2, 1, 16)), ValueError, r"^freqs must have shape \(s2, 1, 1, d2\), got \(8, 2, 1, 16\)"),
        (dict(freqs=meta(8, 1, 1, 7)), ValueError, r"^freqs has last dim 7: the rotary dim must be even and positive"),
        (dict(freqs=meta(8, 1, 1, 0)), ValueError, r"^freqs has last dim 0: the rotary dim must be even"),
        (dict(freqs=meta(8, 1, 1, 18)), ValueError, r"^freqs has last dim 18, more than the head dim 16 of t"),
        (dict(freqs=meta(4, 1, 1, 16)), ValueError,
         r"^freqs has 4 positions \(dim 0\) but t has a sequence of 5 \(dim 0 of sbhd\)"),
        (dict(freqs=meta(4, 16), tensor_format="bshd", t=meta(2, 5, 3, 16)), ValueError,
         r"^freqs has 4 positions \(dim 0\) but t has a sequence of 5 \(dim 1 of bshd\)"),
        (dict(cu_seqlens=meta(3, dtype=torch.int32)), ValueError, r"^cu_seqlens is only used with tensor_format='thd'"),
        (dict(start_positions=meta(3, dtype=torch.int32)), ValueError,
         r"^start_positions has 3 entries but there are 2 batch entries \(dim 1 of t\)"),
        (dict(start_positions=meta(2, 1, dtype=torch.int32)), ValueError, r"^start_positions must have 1 dims"),
        (dict(), ValueError, r"^t is on meta; the kernels run on"),
    ],
)  # fmt: skip
def test_apply_rotary_pos_emb_rejects(kwargs, error, message):
    args = dict(t=T, freqs=FREQS, tensor_format="sbhd", interleaved=False, cu_seqlens=None, start_positions=None)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        apply_rotary_pos_emb(**args)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(t=meta(6, 3, 16, 1)), ValueError, r"^t must have 3 dims, \(total_tokens, h, d\) for tensor_format='thd'"),
        (dict(cu_seqlens=None), ValueError, r"^cu_seqlens is required with tensor_format='thd'"),
        (dict(cu_seqlens=meta(3)), TypeError, r"^cu_seqlens has dtype torch.float32; supported: int32, int64"),
        (dict(cu_seqlens=meta(3, 1, dtype=torch.int32)), ValueError, r"^cu_seqlens must have 1 dims"),
        (dict(cu_seqlens=meta(0, dtype=torch.int32)), ValueError, r"^cu_seqlens must have n_seqs \+ 1 >= 1 entries"),
        (dict(start_positions=meta(3, dtype=torch.int64)), ValueError,
         r"^start_positions has 3 entries but there are 2 sequences"),
    ],
)  # fmt: skip
def test_thd_rejects(kwargs, error, message):
    args = dict(t=meta(6, 3, 16), freqs=FREQS, tensor_format="thd", cu_seqlens=meta(3, dtype=torch.int32))
    args.update(kwargs)
    with pytest.raises(error, match=message):
        apply_rotary_pos_emb(**args)


@pytest.mark.kernels
def test_rejects_freqs_on_another_device(device):
    """t on the kernel device (it needs one), freqs elsewhere."""
    with pytest.raises(ValueError, match=r"^freqs is on meta"):
        apply_rotary_pos_emb(torch.zeros(5, 2, 3, 16, device=device), FREQS)


Q, K = meta(2, 4, 5, 16), meta(2, 2, 5, 16)
COS = meta(1, 5, 16)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(q=(1, 2)), TypeError, r"^q must be a torch.Tensor, got tuple"),
        (dict(k=meta(2, 2, 5, 16, dtype=torch.float16)), TypeError,
         r"^k has dtype torch.float16 but q has torch.float32; they must match"),
        (dict(cos=meta(1, 5, 16, dtype=torch.int32)), TypeError, r"^cos has dtype torch.int32"),
        (dict(sin=meta(1, 5, 16, dtype=torch.bfloat16)), TypeError, r"^sin has dtype torch.bfloat16 but cos has"),
        (dict(position_ids=meta(2, 5)), TypeError, r"^position_ids has dtype torch.float32; supported: int32, int64"),
        (dict(inplace="yes"), TypeError, r"^inplace must be a bool, got str"),
        (dict(q=meta(2, 4, 80)), ValueError,
         r"^q must have 4 dims, \(batch, heads, seq, head_dim\); got shape \(2, 4, 80\)"),
        (dict(k=meta(2, 2, 6, 16)), ValueError, r"^k has shape \(2, 2, 6, 16\) but q has \(2, 4, 5, 16\)"),
        (dict(cos=meta(5 * 16), sin=meta(5 * 16)), ValueError, r"^cos must have 2 or 3 dims"),
        (dict(sin=meta(1, 6, 16)), ValueError, r"^sin has shape \(1, 6, 16\) but cos has \(1, 5, 16\)"),
        (dict(cos=meta(3, 5, 16), sin=meta(3, 5, 16)), ValueError, r"^cos has batch dim 3 \(dim 0\); it must be 1 or"),
        (dict(cos=meta(1, 5, 9), sin=meta(1, 5, 9)), ValueError, r"^cos has last dim 9: the rotary dim must be even"),
        (dict(cos=meta(5, 20), sin=meta(5, 20)), ValueError, r"^cos has last dim 20, more than the head dim 16 of q"),
        (dict(cos=meta(1, 4, 16), sin=meta(1, 4, 16)), ValueError,
         r"^cos has 4 positions \(dim -2\) but q has a sequence of 5"),
        (dict(position_ids=meta(3, 5, dtype=torch.int64)), ValueError, r"^position_ids has shape \(3, 5\); it must be"),
        (dict(position_ids=meta(5, dtype=torch.int64)), ValueError, r"^position_ids must have 2 dims"),
        (dict(q=meta(2, 4, 5, 32)[..., ::2], k=meta(2, 2, 5, 32)[..., ::2], inplace=True), ValueError,
         r"^inplace=True needs q and k with a contiguous last dim"),
        (dict(q=meta(2, 4, 5, 16).requires_grad_(), inplace=True), ValueError,
         r"^inplace=True cannot overwrite q: it is a leaf tensor that requires grad"),
        (dict(), ValueError, r"^q is on meta; the kernels run on"),
    ],
)  # fmt: skip
def test_apply_rotary_qk_rejects(kwargs, error, message):
    args = dict(q=Q, k=K, cos=COS, sin=COS, position_ids=None, inplace=False)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        apply_rotary_qk(**args)


@pytest.fixture
def no_launch(monkeypatch):
    """Replace both launch helpers by a tripwire: a check that runs after a launch would fail loudly."""

    def tripwire(*args, **kwargs):
        raise AssertionError("a kernel was launched before the bad input was rejected")

    monkeypatch.setattr(rope_ops, "_launch", tripwire)
    monkeypatch.setattr(rope_qk_ops, "_launch", tripwire)


@pytest.mark.kernels
@pytest.mark.parametrize(
    "cu, start, message",
    [
        ([1, 3, 6], None, r"^cu_seqlens must start at 0, got cu_seqlens\[0\]=1"),
        ([0, 3, 5], None, r"^cu_seqlens ends at 5 but t has 6 tokens \(dim 0 of thd\)"),
        ([0, 4, 3, 6], None, r"^cu_seqlens must be non-decreasing"),
        ([0, 1, 6], None, r"^freqs has 4 positions \(dim 0\) but a sequence has 5 positions"),
        ([0, 3, 6], [0, 2], r"^freqs has 4 positions \(dim 0\) but a sequence's length plus its start position "
                            r"reaches 5 positions"),
        ([0, 3, 6], [-1, 0], r"^start_positions must be >= 0, got a minimum of -1"),
    ],
)  # fmt: skip
def test_thd_index_values_are_checked_before_launch(cu, start, message, device, no_launch):
    t = torch.zeros(6, 2, 8, device=device)
    cu_seqlens = torch.tensor(cu, dtype=torch.int32, device=device)
    start_positions = None if start is None else torch.tensor(start, device=device)
    with pytest.raises(ValueError, match=message):
        apply_rotary_pos_emb(t, torch.zeros(4, 1, 1, 8, device=device), "thd", False, cu_seqlens, start_positions)


@pytest.mark.kernels
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
@pytest.mark.parametrize(
    "start, message",
    [
        ([0, 3], r"^freqs has 6 positions \(dim 0\) but the sequence length 4 plus the largest start position "
                 r"reaches 7 positions"),
        ([-2, 0], r"^start_positions must be >= 0, got a minimum of -2"),
    ],
)  # fmt: skip
def test_start_positions_are_checked_before_launch(tensor_format, start, message, device, no_launch):
    t = torch.zeros((4, 2, 3, 8) if tensor_format == "sbhd" else (2, 4, 3, 8), device=device)
    with pytest.raises(ValueError, match=message):
        apply_rotary_pos_emb(
            t, torch.zeros(6, 8, device=device), tensor_format, False, None, torch.tensor(start, device=device)
        )


@pytest.mark.kernels
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("bad", [-1, 7])
def test_position_ids_are_checked_before_launch(bad, inplace, device, no_launch):
    q = torch.zeros(2, 3, 4, 8, device=device)
    cos = torch.zeros(7, 8, device=device)
    position_ids = torch.tensor([[0, 1, 2, bad]], device=device)
    with pytest.raises(
        ValueError, match=rf"^position_ids must be in \[0, 7\) .* got values in \[{min(bad, 0)}, {max(bad, 2)}\]"
    ):
        apply_rotary_qk(q, q.clone(), cos, cos, position_ids, inplace=inplace)


def _heads(device, start, stop, step=1):
    """(B, H, S, D) view of heads start:stop:step of one (B, S, 8, D) buffer, as attention code
    slices a fused qkv projection (a new buffer per call)."""
    return torch.zeros(2, 5, 8, 16, device=device)[:, :, start:stop:step].transpose(1, 2)


def _overlapping_heads(device):
    """(2, 4, 5, 16) with heads 32 elements apart but tokens 64 apart: head h + 2 of token s is
    head h of token s + 1."""
    return torch.zeros(800, device=device).as_strided((2, 4, 5, 16), (384, 32, 64, 1))


@pytest.mark.kernels
@pytest.mark.parametrize(
    "make_qk, message",
    [
        (lambda d: (_heads(d, 0, 4),) * 2, r"^q and k are the same tensor: an in-place update would rotate it twice"),
        (lambda d: (lambda q: (q, q[:]))(_heads(d, 0, 4)),
         r"^q and k share memory \(overlapping views of one buffer\): an in-place update would write the shared "
         r"elements twice; pass separate tensors, or use inplace=False$"),
        (lambda d: (lambda x: (x[:, :4], x[:, 3:5]))(_heads(d, 0, 8)), r"^q and k share memory \(overlapping views"),
        (lambda d: (lambda x: (x[:, 2:6], x[:, 0:3]))(_heads(d, 0, 8)), r"^q and k share memory"),
        (lambda d: (lambda x: (x[:, 0::2], x[:, 2:3]))(_heads(d, 0, 8)), r"^q and k share memory"),
        (lambda d: (_heads(d, 0, 4)[:1].expand(2, -1, -1, -1), _heads(d, 4, 6)),
         r"^q has elements that share memory \(an expanded or self-overlapping view\): an in-place update would "
         r"write them more than once; clone it first, or use inplace=False$"),
        (lambda d: (_heads(d, 0, 4), _heads(d, 4, 5).expand(-1, 2, -1, -1)), r"^k has elements that share memory"),
        (lambda d: (_overlapping_heads(d), _heads(d, 0, 2)), r"^q has elements that share memory"),
    ],
)  # fmt: skip
def test_in_place_rejects_memory_shared_between_or_within_q_and_k(make_qk, message, device, no_launch):
    q, k = make_qk(device)
    cos = torch.zeros(5, 16, device=device)
    with pytest.raises(ValueError, match=message):
        apply_rotary_qk(q, k, cos, cos, inplace=True)


@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        ((0,), {}, ValueError, r"^dim must be a positive int, got 0"),
        ((-8,), {}, ValueError, r"^dim must be a positive int, got -8"),
        ((64.0,), {}, TypeError, r"^dim must be an int, got float"),
        ((True,), {}, TypeError, r"^dim must be an int, got bool"),
        ((63,), {}, ValueError, r"^dim must be even with rotary_percent=1.0 \(the rotary dim rotates pairs\), got 63"),
        ((64,), dict(rotary_percent=0.0), ValueError, r"^rotary_percent must be in \(0, 1\], got 0.0$"),
        ((64,), dict(rotary_percent=-0.5), ValueError, r"^rotary_percent must be in \(0, 1\], got -0.5$"),
        ((64,), dict(rotary_percent=float("nan")), ValueError, r"^rotary_percent must be in \(0, 1\], got nan$"),
        ((64,), dict(rotary_percent="half"), TypeError, r"^rotary_percent must be a real number, got str"),
        # The second positional argument is TE's rotary_percent, not the base: an old-style base is refused.
        ((128, 10000.0), {}, ValueError,
         r"^rotary_percent must be in \(0, 1\], got 10000.0 \(the second argument is rotary_percent, as in "
         r"TransformerEngine; the base is rotary_base\)"),
        ((10,), dict(rotary_percent=0.5), ValueError, r"^the rotary dim int\(dim \* rotary_percent\) = 5 must be even"),
        ((64,), dict(rotary_percent=0.01), ValueError, r"^the rotary dim int\(dim \* rotary_percent\) = 0 must be"),
        ((64,), dict(rotary_base=0.0), ValueError, r"^rotary_base must be positive and finite, got 0.0"),
        ((64,), dict(rotary_base=-10.0), ValueError, r"^rotary_base must be positive and finite, got -10.0"),
        ((64,), dict(rotary_base=float("inf")), ValueError, r"^rotary_base must be positive and finite, got inf"),
        ((64,), dict(rotary_base=None), TypeError, r"^rotary_base must be a real number, got NoneType"),
        ((64,), dict(base=500.0), TypeError, r"unexpected keyword argument 'base'"),
        # TE ignores a factor without pretrained_max_position_embeddings; here that call is refused.
        ((64,), dict(seq_len_interpolation_factor=4.0), ValueError,
         r"^seq_len_interpolation_factor needs pretrained_max_position_embeddings \(TransformerEngine ignores"),
        ((64,), dict(seq_len_interpolation_factor=0.0, pretrained_max_position_embeddings=8), ValueError,
         r"^seq_len_interpolation_factor must be positive and finite, got 0.0"),
        ((64,), dict(seq_len_interpolation_factor=2.0, pretrained_max_position_embeddings=0), ValueError,
         r"^pretrained_max_position_embeddings must be a positive int, got 0"),
        ((64,), dict(seq_len_interpolation_factor=2.0, pretrained_max_position_embeddings=8.5), TypeError,
         r"^pretrained_max_position_embeddings must be an int, got float"),
        ((64,), dict(interleaved=1), TypeError, r"^interleaved must be a bool, got int"),
    ],
)  # fmt: skip
def test_rotary_embedding_rejects(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        RotaryEmbedding(*args, **kwargs)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda rope: rope(-1), ValueError, r"^max_seq_len must be a non-negative int, got -1"),
        (lambda rope: rope(4.0), TypeError, r"^max_seq_len must be an int, got float"),
        (lambda rope: rope(True), TypeError, r"^max_seq_len must be an int, got bool"),
        (lambda rope: rope(4, offset=0.5), TypeError, r"^offset must be an int, got float"),
        (lambda rope: rope.cos_sin(-3), ValueError, r"^seq_len must be a non-negative int, got -3"),
        (lambda rope: rope.cos_sin(None), TypeError, r"^seq_len must be an int, got NoneType"),
        (lambda rope: rope.cos_sin(4, dtype=torch.int32), TypeError,
         r"^dtype must be a floating-point torch.dtype, got torch.int32"),
    ],
)  # fmt: skip
def test_rotary_embedding_call_rejects(call, error, message):
    rope = RotaryEmbedding(8)
    with pytest.raises(error, match=message):
        call(rope)
    rope(4)  # a cached length does not let a bad argument through either
    with pytest.raises(error, match=message):
        call(rope)


def test_cos_sin_tables_are_for_rotate_half():
    with pytest.raises(ValueError, match=r"^cos_sin tables are for rotate-half pairs"):
        RotaryEmbedding(16, interleaved=True).cos_sin(4)
