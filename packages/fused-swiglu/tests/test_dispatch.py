"""Launch decisions that need no kernel launch: when the Hopper TMA forward is chosen, which
autotune configs survive pruning, and the weight gradient's split of its last wave."""

import pytest
import torch

from fused_swiglu.kernels import configs
from fused_swiglu.kernels.configs import weight_grad_split
from fused_swiglu.ops import launchers
from fused_swiglu.ops.launchers import (
    tma_ready,
    use_tma_down_grad,
    use_tma_forward,
    use_tma_input_grad,
    use_tma_weight_grad,
)


@pytest.mark.parametrize(
    "layout, ready",
    [
        ("contiguous", True),
        ("narrower view", True),  # 63 of 64 columns: the rows keep a 128-byte stride
        ("odd row stride", False),  # (64, 63) contiguous: 126-byte rows
        ("offset base", False),  # one element in: a 2-byte misaligned base
        ("transposed", False),  # columns not unit-stride
        ("broadcast rows", False),  # row stride 0
    ],
)
def test_tma_needs_aligned_strides_and_base_not_shape(layout, ready):
    """What a TMA descriptor needs (the launcher's tma_ready), checked on CPU tensors: no launch."""
    base = torch.zeros(64, 128, dtype=torch.bfloat16)
    assert base.data_ptr() % 16 == 0
    t = {
        "contiguous": base[:, :64],
        "narrower view": base[:, :63],
        "odd row stride": torch.zeros(64, 63, dtype=torch.bfloat16),
        "offset base": base[:, 1:65],
        "transposed": base[:, :64].t(),
        "broadcast rows": base[:1, :64].expand(64, 64),
    }[layout]
    assert tma_ready(t) is ready


@pytest.mark.parametrize("hopper", [False, True], ids=["off-hopper", "hopper"])
def test_tma_forward_is_chosen_only_on_hopper_with_ready_operands(hopper, monkeypatch):
    """The launcher's choice on any machine: the device capability and Triton's support are
    stubbed, so that the off-Hopper case is tested on a Hopper too (and the Hopper case off it)."""
    monkeypatch.setattr(launchers, "HOPPER_TMA", True)
    monkeypatch.setattr(launchers, "is_hopper", lambda index: hopper)
    x, w_gate, w_up = (torch.zeros(shape, dtype=torch.bfloat16) for shape in ((8, 64), (64, 64), (64, 64)))
    assert use_tma_forward(x, w_gate, w_up) is hopper
    assert use_tma_forward(x, w_gate[:, :56], w_up[:, :56]) is hopper  # a view: aligned strides, 112-byte output rows
    assert not use_tma_forward(x, w_gate[:, :63], w_up[:, :63])  # aligned operands, 126-byte output rows
    assert not use_tma_forward(x, torch.zeros(64, 64, dtype=torch.bfloat16)[:, 1:57], w_up[:, :56])  # unaligned base
    assert not use_tma_forward(x.float(), w_gate.float(), w_up.float())  # 16-bit operands only
    assert use_tma_forward(x, w_gate.t(), w_up.t()) is hopper  # nn.Linear weights' transposed views
    padded = torch.zeros(56, 68, dtype=torch.bfloat16)[:, :64].t()  # (N, K) rows 136 bytes apart
    assert not use_tma_forward(x, padded, padded)
    monkeypatch.setattr(launchers, "HOPPER_TMA", False)  # Triton < 3.4, or interpreting
    assert not use_tma_forward(x, w_gate, w_up)


@pytest.mark.parametrize("hopper", [False, True], ids=["off-hopper", "hopper"])
def test_tma_input_grad_is_chosen_only_on_hopper_with_ready_operands(hopper, monkeypatch):
    """As for the forward: d_gate, d_up (M, N), the weights (K, N) and dx's (M, K) rows must suit TMA."""
    monkeypatch.setattr(launchers, "HOPPER_TMA", True)
    monkeypatch.setattr(launchers, "is_hopper", lambda index: hopper)
    d_gate, d_up = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16)
    w_gate, w_up = torch.zeros(64, 64, dtype=torch.bfloat16), torch.zeros(64, 64, dtype=torch.bfloat16)
    assert use_tma_input_grad(d_gate, d_up, w_gate, w_up) is hopper
    assert not use_tma_input_grad(d_gate, d_up, w_gate[:60], w_up[:60])  # K = 60: 120-byte rows of dx
    assert not use_tma_input_grad(d_gate, torch.zeros(8, 72, dtype=torch.bfloat16)[:, 1:65], w_gate, w_up)  # unaligned
    assert not use_tma_input_grad(d_gate.float(), d_up.float(), w_gate.float(), w_up.float())  # 16-bit only
    monkeypatch.setattr(launchers, "HOPPER_TMA", False)
    assert not use_tma_input_grad(d_gate, d_up, w_gate, w_up)


@pytest.mark.parametrize("hopper", [True, False], ids=["sm90", "sm80"])
def test_tma_down_and_weight_grads_are_chosen_only_on_hopper_with_ready_operands(hopper, monkeypatch):
    """The down-projection backward reads dy (M, D) and w_down (N, D) by TMA, the weight gradients
    x (M, K), d_gate and d_up (M, N); what they write goes through pointers (any width)."""
    monkeypatch.setattr(launchers, "HOPPER_TMA", True)
    monkeypatch.setattr(launchers, "is_hopper", lambda index: hopper)
    dy, w_down = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(72, 64, dtype=torch.bfloat16)
    assert use_tma_down_grad(dy, w_down) is hopper
    assert not use_tma_down_grad(dy, w_down.t().contiguous().t())  # a transposed weight: no unit-stride rows
    assert not use_tma_down_grad(torch.zeros(8, 72, dtype=torch.bfloat16)[:, 1:65], w_down)  # unaligned base
    assert not use_tma_down_grad(dy.float(), w_down.float())  # 16-bit only
    x, d_gate, d_up = (torch.zeros(8, n, dtype=torch.bfloat16) for n in (64, 72, 72))
    assert use_tma_weight_grad(x, d_gate, d_up) is hopper
    assert not use_tma_weight_grad(x, torch.zeros(8, 76, dtype=torch.bfloat16)[:, :72], d_up)  # 152-byte row stride
    assert not use_tma_weight_grad(x.float(), d_gate.float(), d_up.float())  # 16-bit only
    assert not use_tma_weight_grad(torch.zeros(8, 60, dtype=torch.bfloat16), d_gate, d_up)  # 120-byte rows of x
    monkeypatch.setattr(launchers, "HOPPER_TMA", False)  # Triton < 3.4, or interpreting
    assert not use_tma_down_grad(dy, w_down)
    assert not use_tma_weight_grad(x, d_gate, d_up)


@pytest.mark.parametrize(
    "tiles, multiprocessors, steps, split",
    [
        (704, 132, 256, 3),  # the headline: 5 full waves, 44 tiles alone in the sixth -> 132 programs
        (660, 132, 256, 1),  # whole waves: nothing to fill
        (8 * 132 + 5, 132, 256, 1),  # eight full waves first: the idle tail is small
        (20, 132, 256, 4),  # fewer tiles than SMs: at most MAX_SPLIT programs a tile
        (20, 132, 2, 2),  # ... and at least one reduction step each
        (100, 132, 256, 1),  # 132 // 100 = 1
    ],
)
def test_weight_grad_split(tiles, multiprocessors, steps, split):
    assert weight_grad_split(tiles, multiprocessors, steps) == split


def _kwargs(kept):
    return [(c.kwargs, c.num_warps, c.num_stages) for c in kept]


def test_pruning_keeps_what_fits_and_suits_the_problem():
    """fp32 operands keep only the configs whose stages fit in shared memory; a large output keeps
    only the large tiles; a tiny problem keeps tiles no larger than it; never nothing."""
    dual = configs.forward_configs(interpreting=False)
    x16, x32 = torch.empty(0, dtype=torch.bfloat16), torch.empty(0, dtype=torch.float32)
    large = configs.prune_forward(dual, {"x_ptr": x16, "M": 16384, "N": 5632})
    assert _kwargs(large) == _kwargs(dual[:3])  # the 128-row tiles
    fp32 = configs.prune_forward(dual, {"x_ptr": x32, "M": 16384, "N": 5632})
    for c in fp32:
        stage = (c.kwargs["BLOCK_M"] + 2 * c.kwargs["BLOCK_N"]) * c.kwargs["BLOCK_K"] * 4
        assert c.num_stages * stage <= configs.SHARED_MEMORY
    assert _kwargs(fp32) == _kwargs([dual[2]])
    tiny = configs.prune_forward(dual, {"x_ptr": x16, "M": 17, "N": 40})
    assert _kwargs(tiny) == _kwargs([dual[-1]])
    # Up to 16 rows, only the skinny tiles (16 rows), none wider than the output.
    skinny = configs.prune_forward(dual, {"x_ptr": x16, "M": 7, "N": 40})
    assert skinny and all(c.kwargs["BLOCK_M"] == 16 and c.kwargs["BLOCK_N"] <= 64 for c in skinny)
    assert _kwargs(configs.prune_forward(dual, {"x_ptr": x16, "M": 1, "N": 16})) == _kwargs([dual[4]])
    decode = configs.prune_forward(dual, {"x_ptr": x16, "M": 1, "N": 5632})
    assert _kwargs(decode) == _kwargs(dual[4:8])
    fp32_decode = configs.prune_forward(dual, {"x_ptr": x32, "M": 1, "N": 5632})  # fp32 keeps the others
    assert fp32_decode and all(c.kwargs["BLOCK_M"] > 16 for c in fp32_decode)
    tma = configs.forward_tma_configs(interpreting=False)
    two_per_sm = [c for c in tma if c.kwargs["PROGRAMS_PER_SM"] == 2]
    kept = configs.prune_forward(tma, {"x_ptr": x16, "M": 16384, "N": 5632})
    assert two_per_sm and all(c in kept for c in two_per_sm)
    down = configs.down_grad_configs(interpreting=False)
    float64 = {"dy_ptr": torch.empty(0, dtype=torch.float64), "M": 16384, "N": 5632}
    assert _kwargs(configs.prune_down_grad(down[:2], float64)) == _kwargs(down[:1])  # none fits: the smallest


def test_config_lists():
    """Under the interpreter each kernel has one small config; the down-projection backward
    offers both epilogue schedules (row slices, and g, u prefetched: EPILOGUE_M ==
    BLOCK_M), and every EPILOGUE_M divides its BLOCK_M."""
    makers = [configs.forward_configs, configs.forward_tma_configs, configs.weight_grad_configs,
              configs.weight_grad_tma_configs, configs.input_grad_configs, configs.input_grad_tma_configs,
              configs.down_grad_configs, configs.down_grad_tma_configs]  # fmt: skip
    assert all(len(make(interpreting=True)) == 1 for make in makers)
    down = configs.down_grad_configs(interpreting=False) + configs.down_grad_configs(interpreting=True)
    assert all(c.kwargs["BLOCK_M"] % c.kwargs["EPILOGUE_M"] == 0 for c in down)
    assert {c.kwargs["EPILOGUE_M"] == c.kwargs["BLOCK_M"] for c in down} == {True, False}
    # The TMA kernel's epilogue is the row-slice one only.
    down_tma = configs.down_grad_tma_configs(interpreting=False) + configs.down_grad_tma_configs(interpreting=True)
    assert all(c.kwargs["EPILOGUE_M"] < c.kwargs["BLOCK_M"] for c in down_tma)
    assert all(c.kwargs["BLOCK_M"] % c.kwargs["EPILOGUE_M"] == 0 for c in down_tma)
