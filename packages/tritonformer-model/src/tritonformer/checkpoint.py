"""Training checkpoints: everything a run needs to continue exactly where it stopped."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Dict

import torch

from ._compat import TORCH_VERSION

FORMAT_VERSION = 1


def save_checkpoint(path: os.PathLike, state: Dict[str, Any]) -> None:
    """Write state atomically: a crash mid-write leaves the previous checkpoint intact."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"format_version": FORMAT_VERSION, **state}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: os.PathLike) -> Dict[str, Any]:
    """Read a checkpoint written by save_checkpoint onto the CPU (tensors, numbers, strings only)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    safe = {"weights_only": True} if TORCH_VERSION >= (2, 4) else {}
    state = torch.load(path, map_location="cpu", **safe)
    if state.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} has checkpoint format {state.get('format_version')!r}; expected {FORMAT_VERSION}")
    return state
