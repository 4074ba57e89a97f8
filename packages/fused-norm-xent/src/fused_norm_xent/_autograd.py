"""The runtime's differentiable ops under this package's operator library."""

from __future__ import annotations

from ._runtime.registration import differentiable_op as _differentiable_op

LIBRARY = "fused_norm_xent"


def differentiable_op(name: str, **launchers):
    """registration.differentiable_op for the operator "fused_norm_xent::<name>"."""
    return _differentiable_op(f"{LIBRARY}::{name}", **launchers)
