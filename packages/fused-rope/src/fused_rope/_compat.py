"""What this package adds to the shared version shims (`_runtime.compat`, re-exported here)."""

from __future__ import annotations

from ._runtime.compat import (  # noqa: F401 - re-exported for the package's modules and tests
    HAS_CUSTOM_OP,
    INTERPRETING,
    KERNEL_DEVICE_TYPE,
    TRITON_VERSION,
    custom_bwd,
    custom_fwd,
    is_compiling,
)

# tl.split / tl.join (Triton >= 3.0): interleaved pairs are separated in registers.
HAS_SPLIT_JOIN = TRITON_VERSION >= (3, 0)
