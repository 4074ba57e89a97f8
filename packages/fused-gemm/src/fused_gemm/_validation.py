"""This package's own argument checks (the shared ones are in `_runtime.validation`)."""

from __future__ import annotations

from typing import Optional

ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh")


def check_activation(activation) -> Optional[str]:
    """`activation` is None or one of the epilogue names."""
    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"activation must be None or a str, got {type(activation).__name__}")
    if activation not in ACTIVATIONS:
        choices = ", ".join(repr(a) for a in ACTIVATIONS)
        raise ValueError(f"activation={activation!r} is not supported; choose one of {choices}")
    return activation


def check_allow_tf32(allow_tf32) -> None:
    if allow_tf32 is not None and not isinstance(allow_tf32, bool):
        raise TypeError(f"allow_tf32 must be None, True or False, got {type(allow_tf32).__name__}")
