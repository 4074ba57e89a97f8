"""Calls from several threads at once, with different shapes, each get their own plan's results.

Each autotuned kernel offers two configs of different block sizes here, and a row count picks one
of them by pruning (so that nothing is timed, which the interpreter cannot do): calls of different
row counts at once then tune to different configs. Triton's autotuner keeps the call it tunes and
the config it ran last on itself, so a call that read the autotuner's choice after its launch could
take another call's config: launch with its block sizes, or add up the weight gradient's split
last wave with the wrong tiles. The pruning holds each thread until the others have reached the
same kernel's tuning (`_Meeting`), so that the calls are inside the autotuner together wherever
nothing keeps them apart.

Triton's interpreter runs every kernel on one global builder (its program ids, its patched
language): interpreted kernels cannot run at once, so the test kit's fixture `one_interpreted_kernel_at_a_time`
serializes the kernels themselves; everything on the host (checks, plans, tuning, launches)
runs concurrently.
"""

import threading

import pytest
import torch
import triton
from tritonformer_testkit import assert_close_to_reference, poisoned_allocations, run_in_threads

from fused_swiglu import swiglu, swiglu_mlp
from fused_swiglu._compat import multiprocessor_count
from fused_swiglu.kernels.backward import _swiglu_weight_grad_kernel
from fused_swiglu.kernels.configs import weight_grad_split
from fused_swiglu.reference import swiglu_mlp_reference, swiglu_reference

pytestmark = pytest.mark.kernels

# The threads' row counts: the first below SECOND_CONFIG_ROWS, the second from it on.
ROWS = (42, 70)
SECOND_CONFIG_ROWS = 64
# The two configs split the weight gradient's last wave differently at these dims (checked below).
D_MODEL, D_INTERMEDIATE = 56, 32
# The second config's first three block sizes (rows, columns, reduction in each kernel's naming).
SECOND_BLOCKS = (16, 64, 32)
# How long a thread in the tuning waits for the other (tuning under a lock lets in one at a time).
MEETING_SECONDS = 0.5
REFERENCES = {swiglu: swiglu_reference, swiglu_mlp: swiglu_mlp_reference}


def _second_config(config: triton.Config) -> triton.Config:
    """`config` with SECOND_BLOCKS as its block sizes (an epilogue's row slices no taller than them)."""
    kwargs = dict(config.kwargs)
    blocks = [name for name in kwargs if name.startswith("BLOCK_")][:3]
    kwargs.update(zip(blocks, SECOND_BLOCKS))
    if "EPILOGUE_M" in kwargs:
        kwargs["EPILOGUE_M"] = min(kwargs["EPILOGUE_M"], kwargs["BLOCK_M"])
    return triton.Config(kwargs, num_warps=config.num_warps, num_stages=config.num_stages, pre_hook=config.pre_hook)


def _choose_by_rows(configs, named_args):
    return [configs[0] if named_args["M"] < SECOND_CONFIG_ROWS else configs[1]]


class _Meeting:
    """Holds each thread that arrives until all of ROWS have arrived, or MEETING_SECONDS passed."""

    def __init__(self):
        self._arrived = 0
        self._condition = threading.Condition()

    def prune(self, configs, named_args, **kwargs):
        with self._condition:
            self._arrived += 1
            self._condition.notify_all()
            self._condition.wait_for(lambda: self._arrived >= len(ROWS), timeout=MEETING_SECONDS)
        return _choose_by_rows(configs, named_args)


def _two_configs_chosen_by_rows(monkeypatch, sw):
    for kernel in sw.all_configs:
        first = kernel.configs[0]  # pinned (GPU) or the interpreter's one config
        monkeypatch.setattr(kernel, "configs", [first, _second_config(first)])
        monkeypatch.setattr(kernel, "early_config_prune", _Meeting().prune)
        monkeypatch.setattr(kernel, "cache", {})


def test_the_configs_split_the_weight_gradient_differently(sw, device, monkeypatch):
    """The premise of the race below: the two threads' configs split the weight gradient's last
    wave over different numbers of programs (so that a reduction with the other's config errs)."""
    _two_configs_chosen_by_rows(monkeypatch, sw)
    sms = multiprocessor_count(torch.device(device))
    splits = set()
    for rows in ROWS:
        config = _choose_by_rows(_swiglu_weight_grad_kernel.configs, {"M": rows})[0].kwargs
        tiles = triton.cdiv(D_MODEL, config["BLOCK_K"]) * triton.cdiv(D_INTERMEDIATE, config["BLOCK_N"])
        splits.add(weight_grad_split(tiles, sms, triton.cdiv(rows, config["BLOCK_M"])))
    assert len(splits) == 2


@pytest.mark.parametrize("op", [swiglu, swiglu_mlp], ids=["swiglu", "swiglu_mlp"])
def test_concurrent_calls_of_different_shapes(op, device, sw, monkeypatch, one_interpreted_kernel_at_a_time):
    _two_configs_chosen_by_rows(monkeypatch, sw)
    work = []
    for rows in ROWS:
        inputs = sw.make_inputs((rows,), D_MODEL, D_INTERMEDIATE, torch.bfloat16, device)
        if op is swiglu_mlp:
            inputs.append(sw.linear_weight(D_INTERMEDIATE, D_MODEL, device, torch.bfloat16).requires_grad_())
        work.append((op, inputs))
    results = {}

    def call(index):
        op, inputs = work[index]
        for repeat in range(2):  # tuned on the first call, through the published Launch on the second
            results[index, repeat] = sw.outputs_and_grads(op, inputs)

    with poisoned_allocations():  # entered once, here: patching torch.empty is not thread-safe
        errors = run_in_threads(call, len(work))
    assert errors == [None] * len(work), errors
    for index, (op, inputs) in enumerate(work):
        for repeat in range(2):
            y, grads, dy = results[index, repeat]
            y_ref, grads_ref, _ = sw.outputs_and_grads(REFERENCES[op], sw.detached(inputs, torch.float64), dy.double())
            y_low, grads_low, _ = sw.outputs_and_grads(REFERENCES[op], sw.detached(inputs), dy)
            where = f"thread {index} ({len(inputs[0])} rows), call {repeat}"
            assert_close_to_reference(y, y_ref, y_low, name=f"y of {where}")
            for name, g, g_ref, g_low in zip(("dx", "dw_gate", "dw_up", "dw_down"), grads, grads_ref, grads_low):
                assert_close_to_reference(g, g_ref, g_low, name=f"{name} of {where}")
