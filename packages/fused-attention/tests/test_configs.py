"""The autotune tables and the kernels' argument order agree (no launch: runs everywhere)."""

import inspect

import pytest
from tritonformer_testkit.aot import autotune_configs

from fused_attention.ops.configs import (
    AUTOTUNE_KEY,
    KERNELS,
    POINTER_CONFIGS,
    TMA_CONFIGS,
    autotuned_kernel,
    candidate_configs,
)
from fused_attention.ops.launch import DESCRIPTOR_POSITION

TUNED = ["BLOCK_M", "BLOCK_N", "USE_TMA"]


def _arg_names(kind):
    return list(inspect.signature(KERNELS[kind].fn).parameters)  # jitted or interpreted


@pytest.mark.parametrize("kind", list(KERNELS))
def test_autotuned_meta_parameters_come_last(kind):
    """Triton 2.2's autotuner indexes its key by position among the arguments the caller passes,
    which excludes the ones each config supplies: those must follow every key argument."""
    names = _arg_names(kind)
    assert names[-len(TUNED) :] == TUNED
    assert all(names.index(key) < len(names) - len(TUNED) for key in AUTOTUNE_KEY)


@pytest.mark.parametrize("kind", list(KERNELS))
def test_descriptor_arguments_sit_where_the_launcher_puts_them(kind):
    names = _arg_names(kind)
    position = DESCRIPTOR_POSITION[kind]
    assert names[position].endswith("_desc") and names[position + 1].endswith("_desc")
    assert not names[position - 1].endswith("_desc")


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("kind", list(KERNELS))
def test_tables(kind, tma):
    table = (TMA_CONFIGS if tma else POINTER_CONFIGS)[kind]
    assert sorted(table) == [64, 128, 256]
    for block_d, configs in table.items():
        assert configs and all(c.use_tma == tma for c in configs)
        assert len(set(configs)) == len(configs)
        tuned = autotune_configs(autotuned_kernel(kind, block_d, tma))
        assert [sorted(c) for c in tuned] == [sorted([*TUNED, "num_warps", "num_stages"])] * len(tuned)
        assert len(tuned) == len(candidate_configs(kind, block_d, tma))
