"""Dev-only helpers shared by the Tritonformer test suites and benchmarks."""

from .autocast import assert_autocast_close_to_reference
from .dtypes import FLOAT_DTYPES, LOW_PRECISION_DTYPES, dtype_params
from .poison import poisoned_allocations
from .runtime import (
    can_execute_kernels,
    gpu_available,
    interpreting,
    kernel_device,
    triton_version,
)
from .threads import run_in_threads
from .tolerance import assert_close_to_reference, assert_rms_close_to_reference

__version__ = "0.1.0"

__all__ = [
    "FLOAT_DTYPES",
    "LOW_PRECISION_DTYPES",
    "assert_autocast_close_to_reference",
    "assert_close_to_reference",
    "assert_rms_close_to_reference",
    "can_execute_kernels",
    "dtype_params",
    "gpu_available",
    "interpreting",
    "kernel_device",
    "poisoned_allocations",
    "run_in_threads",
    "triton_version",
]
