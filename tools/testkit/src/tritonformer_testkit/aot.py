"""Ahead-of-time compile check: a kernel specialization to a cubin, with no GPU.

Every Triton of the matrix compiles here for sm_80 and sm_90; a kernel that stops compiling
under one version fails its package's compile test on a CPU-only machine. Triton 2.2 builds a
launcher stub after the cubin, which needs libcuda: there the compile stops after the cubin.
"""

from __future__ import annotations

import collections
import os
import subprocess
import tempfile
from typing import Any, Dict, List, Mapping, Tuple
from unittest import mock

import triton

from .runtime import aot_blocker, triton_version

ARCHS = (80, 90)

# (kernel name, arch) of every cubin compiled in this process, for the end-of-run summary.
COMPILED: List[Tuple[str, int]] = []


def base_jit_function(kernel):
    """The JITFunction under any autotune / heuristics wrappers."""
    while not isinstance(kernel, triton.runtime.JITFunction):
        if not hasattr(kernel, "fn"):
            raise TypeError(f"{kernel!r} is not a Triton kernel (no JITFunction inside)")
        kernel = kernel.fn
    return kernel


def autotune_configs(kernel) -> List[Dict[str, Any]]:
    """Each autotune config of `kernel` as {constexprs..., num_warps, num_stages}; [] if not autotuned."""
    while kernel is not None and not isinstance(kernel, triton.runtime.JITFunction):
        if isinstance(kernel, triton.runtime.Autotuner):
            return [
                dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
                for config in kernel.configs
            ]
        kernel = getattr(kernel, "fn", None)
    return []


def _check_arguments(fn, signature: Mapping[str, str], constexprs: Mapping[str, Any]) -> None:
    params = list(fn.arg_names)
    constexpr_names = {params[i] for i in fn.constexprs}
    missing = [p for p in params if p not in signature and p not in constexprs]
    unknown = [p for p in list(signature) + list(constexprs) if p not in params]
    misplaced = [p for p in signature if p in constexpr_names]
    if missing or unknown or misplaced:
        raise ValueError(
            f"{fn.__name__}: arguments missing {missing}, unknown {unknown}, constexpr given a runtime type {misplaced}"
        )


def _is_gluon(fn) -> bool:
    """Whether fn is a Gluon kernel (triton.experimental.gluon.jit), compiled from its own AST source."""
    return type(fn).__name__.startswith("Gluon")


def _compile_triton3(fn, signature, constexprs, arch, num_warps, num_stages):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    full_signature = {name: ("constexpr" if name in constexprs else signature[name]) for name in fn.arg_names}
    aligned = {
        (i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if full_signature[name].startswith("*")
    }
    if _is_gluon(fn):
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    source = ASTSource(fn, signature=full_signature, constexprs=dict(constexprs), attrs=aligned)
    return triton.compile(
        source,
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


_Triton2Specialization = collections.namedtuple(
    "instance_descriptor", ["divisible_by_16", "equal_to_1", "ids_of_folded_args", "divisible_by_8"]
)


def _compile_triton2(fn, signature, constexprs, arch, num_warps, num_stages):
    from triton.compiler import compiler as triton_compiler

    index = {name: i for i, name in enumerate(fn.arg_names)}
    pointers = tuple(index[name] for name, ty in signature.items() if ty.startswith("*"))
    # The JIT keys the signature and the constants by argument position, and reads the signature's
    # types in the dict's order: it must be in argument order.
    with (
        mock.patch.object(triton_compiler, "make_stub", lambda *args, **kwargs: None),
        mock.patch.object(triton_compiler, "CompiledKernel", lambda fn, so_path, metadata, asm: asm),
    ):
        asm = triton_compiler.compile(
            fn,
            signature={index[name]: ty for name, ty in sorted(signature.items(), key=lambda item: index[item[0]])},
            constants={index[name]: value for name, value in constexprs.items()},
            configs=[_Triton2Specialization(pointers, (), (), ())],
            cc=arch,
            num_warps=num_warps,
            num_stages=num_stages,
            device_type="cuda",
        )
    return asm


def _checked_function(kernel, signature: Mapping[str, str], constexprs: Mapping[str, Any]):
    """The JIT function under `kernel`, its arguments checked against signature and constexprs;
    raises where this machine cannot compile ahead of time."""
    blocker = aot_blocker()
    if blocker:
        raise RuntimeError(blocker)
    fn = base_jit_function(kernel)
    _check_arguments(fn, signature, constexprs)
    return fn


def compile_to_asm(
    kernel,
    *,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any],
    arch: int,
    num_warps: int = 4,
    num_stages: int = 3,
    serialized_wgmma_ok: bool = False,
) -> Dict[str, Any]:
    """Compile one specialization of `kernel` for sm_`arch` and return its stages by name
    ("ptx", "cubin", ...).

    signature: a Triton type for each runtime argument, e.g. {"x_ptr": "*bf16", "n_cols": "i32"}.
    constexprs: a value for each tl.constexpr argument, e.g. {"BLOCK_N": 1024}.
    Pointers are marked 16-byte aligned, as the JIT marks torch allocations.
    On sm_90 with Triton 3.x the compile fails if ptxas serialized the kernel's wgmma instructions
    (`serialized_wgmma_notes`), unless `serialized_wgmma_ok` (a known case, documented where passed).
    """
    fn = _checked_function(kernel, signature, constexprs)
    if triton_version() >= (3, 0):
        asm = _compile_triton3(fn, signature, constexprs, arch, num_warps, num_stages).asm
    else:
        asm = _compile_triton2(fn, signature, constexprs, arch, num_warps, num_stages)
    if not asm.get("cubin"):
        raise AssertionError(f"{fn.__name__}: empty cubin for sm_{arch}")
    COMPILED.append((fn.__name__, arch))
    if arch == 90 and triton_version() >= (3, 0) and not serialized_wgmma_ok:
        notes = serialized_wgmma_notes(asm["ptx"])
        if notes:
            raise AssertionError(f"{fn.__name__}: ptxas serialized its wgmma instructions on sm_90: {notes[0]}")
    return asm


def gluon_descriptor_type(block_shape, dtype: str) -> str:
    """The signature type of a Gluon TMA descriptor argument ("bf16" or "fp16" blocks of
    `block_shape`, with Gluon's default NVMMA shared layout for them), as the JIT would see it."""
    from triton.experimental.gluon import language as gl

    layout = gl.NVMMASharedLayout.get_default_for(
        list(block_shape), getattr(gl, {"bf16": "bfloat16", "fp16": "float16"}[dtype])
    )
    return f"tensordesc<{dtype}[{','.join(map(str, block_shape))}],{layout!r}>"


def compile_to_cubin(kernel, **options: Any) -> bytes:
    """compile_to_asm's cubin."""
    return compile_to_asm(kernel, **options)["cubin"]


def serialized_wgmma_notes(ptx: str) -> List[str]:
    """ptxas's notes (C75xx) that it serialized the wgmma instructions of an sm_90 kernel's PTX.

    Serialized, each of Hopper's asynchronous MMAs waits for the one before it to finish, for the
    whole kernel: a slowdown the kernel's source does not show and its results do not reveal.
    Runs the ptxas that Triton ships (Triton 3.x) with -v.
    """
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "kernel.ptx")
        with open(path, "w") as handle:
            handle.write(ptx)
        log = subprocess.run(
            [get_ptxas(90).path, "-arch=sm_90a", "-v", path, "-o", os.devnull],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
    return [line for line in log.splitlines() if "wgmma.mma_async instructions are serialized" in line]


def shared_memory_bytes(
    kernel, *, signature: Mapping[str, str], constexprs: Mapping[str, Any], arch: int, num_warps: int = 4,
    num_stages: int = 3,
) -> int:  # fmt: skip
    """The shared memory one program of this specialization needs (Triton >= 3.0: its compile
    metadata), as compile_to_asm compiles it."""
    if triton_version() < (3, 0):
        raise RuntimeError("shared_memory_bytes needs Triton >= 3.0 (its compile metadata)")
    fn = _checked_function(kernel, signature, constexprs)
    return int(_compile_triton3(fn, signature, constexprs, arch, num_warps, num_stages).metadata.shared)
