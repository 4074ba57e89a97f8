"""The autotune tables and the kernels' argument order agree (no launch: runs everywhere)."""

import inspect

import pytest
import torch
from tritonformer_testkit.aot import autotune_configs

from fused_attention.ops.configs import (
    AUTOTUNE_KEY,
    KERNELS,
    POINTER_CONFIGS,
    TMA_CONFIGS,
    autotuned_kernel,
    candidate_configs,
    length_class,
)
from fused_attention.ops.launch import DESCRIPTOR_POSITION, AttentionSpec, _descriptor_view, _tma_views

TUNED = ["BLOCK_M", "BLOCK_N", "USE_TMA"]


def _arg_names(kind):
    return list(inspect.signature(KERNELS[kind].fn).parameters)  # jitted or interpreted


@pytest.mark.parametrize("kind", list(KERNELS))
def test_autotuned_meta_parameters_come_last(kind):
    """Triton 2.2's autotuner indexes its key by position among the arguments the caller passes,
    which excludes the ones each config supplies: those must follow every key argument."""
    names = _arg_names(kind)
    assert names[-len(TUNED) :] == TUNED
    assert all(names.index(key) < len(names) - len(TUNED) for key in AUTOTUNE_KEY[kind])


@pytest.mark.parametrize("kind", list(KERNELS))
def test_descriptor_arguments_sit_where_the_launcher_puts_them(kind):
    names = _arg_names(kind)
    position = DESCRIPTOR_POSITION[kind]
    assert names[position].endswith("_desc") and names[position + 1].endswith("_desc")
    assert not names[position - 1].endswith("_desc")


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("kind", list(KERNELS))
def test_tables(kind, tma, full_autotune):
    table = (TMA_CONFIGS if tma else POINTER_CONFIGS)[kind]
    assert sorted(table) == [64, 128, 256]
    for block_d, configs in table.items():
        assert configs and all(c.use_tma == tma for c in configs)
        assert len(set(configs)) == len(configs)
        tuned = autotune_configs(autotuned_kernel(kind, block_d, tma))
        assert [sorted(c) for c in tuned] == [sorted([*TUNED, "num_warps", "num_stages"])] * len(tuned)
        assert len(tuned) == len(candidate_configs(kind, block_d, tma))


def _view(t, spec):
    return _descriptor_view(t.shape, t.stride(), t.element_size(), spec)


def _heads_outer(spec, *tensors, aligned=True):
    views = _tma_views(spec, [(t.shape, t.stride()) for t in tensors], tensors[0].element_size(), aligned)
    return None if views is None else views[0][2]


def test_tma_views_follow_memory_order():
    """Descriptor dims follow the memory order (strides non-increasing); what TMA cannot address is refused."""
    spec = AttentionSpec(2, 4, 4, 64, 128, 128, 0.125, -1, -1, False, False, False)
    sdpa = AttentionSpec(2, 4, 4, 64, 128, 128, 0.125, -1, -1, False, False, True)
    bshd = torch.empty(2, 128, 4, 64, dtype=torch.bfloat16)
    assert _view(bshd, spec) == ([2, 128, 4, 64], [128 * 4 * 64, 4 * 64, 64, 1], False)
    bhsd = torch.empty(2, 4, 128, 64, dtype=torch.bfloat16)
    assert _view(bhsd, sdpa) == ([2, 4, 128, 64], [4 * 128 * 64, 128 * 64, 64, 1], True)
    # Size-1 dims take packed strides; a packed varlen batch is batch 1.
    one = torch.empty(1, 128, 1, 64, dtype=torch.bfloat16)[:, :, :, :]
    assert _view(one, spec) == ([1, 128, 1, 64], [128 * 64, 64, 64, 1], False)
    packed = AttentionSpec(3, 4, 4, 64, 50, 50, 0.125, -1, -1, False, True, False)
    assert _view(torch.empty(90, 4, 64, dtype=torch.bfloat16), packed) == (
        [1, 90, 4, 64],
        [90 * 256, 256, 64, 1],
        False,
    )
    assert _heads_outer(spec, bshd, bshd) is False and _heads_outer(sdpa, bhsd, bhsd) is True
    # Not addressable: a head stride that is not a multiple of 16 bytes, an empty tensor, a zero
    # stride, mixed orders for the two streamed tensors, a base that is not 16-byte aligned.
    odd = torch.empty(2, 128, 4, 65, dtype=torch.bfloat16)[..., :64]
    assert _view(odd, spec) is None
    assert _view(torch.empty(2, 0, 4, 64, dtype=torch.bfloat16), spec) is None
    assert _view(torch.empty(1, 128, 1, 64, dtype=torch.bfloat16).expand(2, 128, 4, 64), spec) is None
    assert _heads_outer(spec, bshd, bhsd.transpose(1, 2)) is None
    assert _heads_outer(spec, bshd, bshd, aligned=False) is None


def test_length_classes():
    """One autotuner per power of two of the longest sequence, 1024 and below sharing one, 8192 and above one."""
    assert [length_class(n) for n in (0, 1, 512, 1024)] == [10] * 4
    assert [length_class(n) for n in (1025, 2048, 2049, 4096, 8192, 8193, 65536)] == [11, 11, 12, 12, 13, 13, 13]
