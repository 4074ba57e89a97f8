"""Calls from several threads at once, each its own shape and options, each get their own results.

Plans are immutable values published whole (a PublishedCache per public function, lru_cache'd
launch plans: two threads that build the same plan each get a complete one), and each Launch keeps
its compiled kernels by whole entries. Where a kernel has several candidate configs, Triton's
autotuner keeps the call it tunes on itself (`nargs`, which its config pre-hooks read to give
the TMA descriptors their block shape, and `best_config`): two calls inside it at once could give
one call's descriptors the other's block shape, or read the other's choice. The runtime's tuning
runs the autotuner under the kernel's lock, once per plan, and publishes the Launch of its
choice with the descriptor templates its pre-hook shaped.

Under the interpreter, Triton keeps the running program's id and its patched `triton.language`
in process-wide state, so two interpreted kernels cannot overlap: the test kit's fixture
`one_interpreted_kernel_at_a_time` runs kernel bodies one at a time while everything around them
(checks, plans, tuning, allocation, launch assembly) runs concurrently.
"""

import dataclasses
import threading

import pytest
import torch
from tritonformer_testkit import run_in_threads

from fused_attention import alibi_slopes, flash_attention, flash_attention_qkvpacked, flash_attention_varlen
from fused_attention._runtime.compat import HAS_TENSOR_DESCRIPTORS
from fused_attention.ops import configs, launch

pytestmark = pytest.mark.kernels

BF16, FP16 = torch.bfloat16, torch.float16


def _dense_case(attn, device, batch, seqlen, heads, kv_heads, head_dim, dtype, layout, **options):
    q, k, v = attn.random_qkv(batch, seqlen, seqlen, heads, kv_heads, head_dim, dtype, device, layout=layout)
    dout = torch.randn(q.shape, device=device).to(dtype)

    def run():
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out, lse = flash_attention(*leaves, return_lse=True, layout=layout, **options)
        return {"out": out, "lse": lse, **dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, leaves, dout)))}

    def check(ours):
        options.pop("deterministic", None)
        ref = attn.reference(q, k, v, dout, layout=layout, **options)
        attn.compare(ours, ref, attn.lowp_twin(q, k, v, dout, layout=layout, **options))

    return run, check


def _varlen_case(attn, device, lengths, **options):
    q, k, v = (torch.randn(sum(lengths), 2, 32, device=device).to(BF16) for _ in range(3))
    cu = attn.cu_seqlens(lengths, device)
    dout = torch.randn(q.shape, device=device).to(BF16)

    def run():
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out, lse = flash_attention_varlen(*leaves, cu, cu, max(lengths), max(lengths), return_lse=True, **options)
        return {"out": out, "lse": lse, **dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, leaves, dout)))}

    def check(ours):
        attn.compare(ours, *attn.varlen_expected(q, k, v, dout, None, cu, cu, **options))

    return run, check


def _packed_case(attn, device):
    qkv = torch.randn(1, 21, 6, 32, device=device).to(BF16)
    dout = torch.randn(1, 21, 2, 32, device=device).to(BF16)

    def through(fn):
        leaf = qkv.detach().requires_grad_(True)
        out = fn(leaf)
        return out, torch.autograd.grad(out, leaf, dout)[0]

    def run():
        return through(lambda t: flash_attention_qkvpacked(t, causal=True, deterministic=True))

    def check(ours):  # the packed path runs the kernels of flash_attention on the views
        views = through(lambda t: flash_attention(*t.split((2, 2, 2), dim=2), causal=True, deterministic=True))
        for got, expected in zip(ours, views):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)

    return run, check


def _run_concurrently(cases, repeats=2):
    """Each case's run() in its own thread, `repeats` times (the plans built, then found); returns
    the results by (case, repeat)."""
    results = {}

    def work(index):
        for repeat in range(repeats):
            results[index, repeat] = cases[index][0]()

    errors = run_in_threads(work, len(cases))
    assert errors == [None] * len(cases), errors
    return results


def test_concurrent_calls_of_different_shapes(attn, device, one_interpreted_kernel_at_a_time):
    launch.clear_plans()
    cases = [
        _dense_case(attn, device, 2, 37, 4, 2, 32, BF16, "bshd", causal=True),
        _dense_case(
            attn, device, 1, 50, 2, 1, 64, FP16, "bhsd", window_size=(9, 3), alibi_slopes=alibi_slopes(2, device=device)
        ),
        _dense_case(attn, device, 2, 19, 2, 2, 32, BF16, "bshd", deterministic=True),
        _varlen_case(attn, device, [13, 29, 1], causal=True),
        _packed_case(attn, device),
    ]
    results = _run_concurrently(cases)
    for index, (_, check) in enumerate(cases):
        for repeat in range(2):
            check(results[index, repeat])


# The two configs the autotuner is offered per kernel in the tuning test: unequal blocks, so that a
# descriptor shaped for one config does not fit the other's loads.
def _two_configs(kind, block_d, tma):
    first = configs.INTERPRETER_CONFIGS[kind]
    second = dataclasses.replace(first, block_m=first.block_n, block_n=first.block_m)
    return [dataclasses.replace(c, use_tma=HAS_TENSOR_DESCRIPTORS) for c in (first, second)]


# How long a call inside the autotuner waits for the other (tuning under a lock lets in one at a time).
MEETING_SECONDS = 0.5


def _pruning_by_dtype():
    """An autotuner pruning that keeps the first config for bf16 calls and the second for fp16
    ones, once both calls are inside the autotuner (or MEETING_SECONDS passed)."""
    both_inside = threading.Barrier(2)

    def prune(candidates, named_args, **kwargs):
        try:
            both_inside.wait(MEETING_SECONDS)
        except threading.BrokenBarrierError:  # the other call waits outside
            pass
        return [candidates[0] if named_args["q_ptr"].dtype == BF16 else candidates[1]]

    return prune


def test_concurrent_tuning_publishes_each_choice_whole(attn, device, monkeypatch, one_interpreted_kernel_at_a_time):
    """Two calls (bf16 and fp16: two autotuner keys of one autotuner per kernel) tune at once, each
    to its own config (the pruning picks by dtype, so nothing is timed, which the interpreter
    cannot do); each plan's later call launches its published choice. With descriptors (Triton >=
    3.4) the configs' pre-hooks shape them, as on Hopper."""
    monkeypatch.setattr(configs, "candidate_configs", _two_configs)
    launch.clear_plans()
    for kind in configs.KERNELS:
        tuner = configs.autotuned_kernel(kind, 32, HAS_TENSOR_DESCRIPTORS, 10)
        monkeypatch.setattr(tuner, "early_config_prune", _pruning_by_dtype())
    cases = [
        _dense_case(attn, device, 2, 40, 2, 2, 32, BF16, "bshd", causal=True, deterministic=True),
        _dense_case(attn, device, 1, 24, 2, 1, 32, FP16, "bshd", causal=True, deterministic=True),
    ]
    results = _run_concurrently(cases)
    for index, (_, check) in enumerate(cases):
        for repeat in range(2):
            check(results[index, repeat])
    for kind in configs.KERNELS:
        chosen = {
            entry.config.kwargs["BLOCK_N"]
            for entry in configs.tuned_kernel(kind, 32, HAS_TENSOR_DESCRIPTORS, 10).entries()
        }
        assert len(chosen) == 2, kind  # each plan its own config
