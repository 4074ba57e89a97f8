"""Dtype parametrization shared by the suites."""

from __future__ import annotations

import pytest
import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LOW_PRECISION_DTYPES = (torch.float16, torch.bfloat16)

_SHORT_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


def dtype_name(dtype: torch.dtype) -> str:
    return _SHORT_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def dtype_params(dtypes=FLOAT_DTYPES):
    """pytest.param for each dtype with a short id (fp32, fp16, bf16)."""
    return [pytest.param(d, id=dtype_name(d)) for d in dtypes]
