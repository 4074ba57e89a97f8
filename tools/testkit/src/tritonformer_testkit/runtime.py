"""Where kernels can run in this process, and why not when they cannot."""

from __future__ import annotations

import functools
import importlib
import os
from typing import Optional

import torch
import triton


def triton_version() -> tuple[int, int]:
    """(major, minor) of the Triton that is imported, e.g. (2, 2) or (3, 9)."""
    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1).

    Triton reads the variable when `@triton.jit` decorates a kernel, so it must be set before
    the kernel packages are imported; the test sessions set it in the environment.
    """
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def gpu_available() -> bool:
    return torch.cuda.is_available()


def kernel_device() -> str:
    """The torch device that kernel inputs live on: the CPU when interpreting, else CUDA."""
    return "cpu" if interpreting() else "cuda"


def kernel_execution_blocker() -> Optional[str]:
    """None when kernels can run here, else the exact reason they cannot."""
    old_interpreter = triton_version() < (3, 0)
    if interpreting():
        if old_interpreter:
            return (
                f"Triton {triton.__version__}'s interpreter cannot run 2-D kernels (nor bf16): "
                "kernels run compiled on a GPU, and the AOT compile check covers this Triton on a CPU"
            )
        return None
    if gpu_available():
        return None
    if old_interpreter:
        return (
            f"no CUDA GPU, and Triton {triton.__version__}'s interpreter cannot run 2-D kernels: "
            "kernels run compiled on a GPU, and the AOT compile check covers this Triton on a CPU"
        )
    return "no CUDA GPU and TRITON_INTERPRET is not 1: set TRITON_INTERPRET=1 to run kernels in Triton's interpreter"


def can_execute_kernels() -> bool:
    return kernel_execution_blocker() is None


def torch_compile_blocker() -> Optional[str]:
    """None when torch.compile (Dynamo, AOTAutograd, Inductor) can work with the loaded Triton.

    torch >= 2.3 imports `triton.backends` as soon as it compiles; a Triton 2.x put first on the
    path beside such a torch (the offline GPU box's Triton 2.2 run) breaks every torch.compile.
    """
    torch_version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if triton_version() < (3, 0) and torch_version >= (2, 3):
        return (
            f"torch {torch.__version__}'s torch.compile imports triton.backends, which Triton "
            f"{triton.__version__} lacks (this torch pairs with Triton 3.x)"
        )
    return None


@functools.cache
def torch_dynamo_blocker() -> Optional[str]:
    """None when torch._dynamo imports, else why not (the import error).

    Not only torch.compile needs it: torch.optim's optimizer steps, torch.utils.checkpoint,
    transformers' models and a custom op's autograd path import it lazily. torch >= 2.3 beside
    a Triton 2.x (a Triton 2.2 environment, on a CPU or a GPU) cannot: its inductor
    imports `triton.backends`, which only Triton 3 has.
    """
    try:
        importlib.import_module("torch._dynamo")
    except ImportError as error:
        return (
            f"torch {torch.__version__} cannot import torch._dynamo beside Triton {triton.__version__} ({error}); "
            "its optimizers, torch.utils.checkpoint, transformers and custom-op autograd need it"
        )
    return None


def aot_blocker() -> Optional[str]:
    """None when kernels can be compiled ahead of time here, else why not."""
    if interpreting():
        return (
            "TRITON_INTERPRET=1 turns @triton.jit kernels into interpreted functions, which cannot be "
            "compiled: the AOT compile check runs in the pass without the interpreter"
        )
    return None
