"""Helpers the GPU lab tools share (imported as a sibling module: the tools run from tools/gpu).

- Other versions of the code beside the installed one: a kernel file loaded as a module of its
  package (its relative imports resolve), or a whole copy of a package under its own name.
- fused-gemm's operands and config names, as the GEMM tools build and print them.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
from types import ModuleType

import torch


def load_module_as(path: str, package: str, name: str) -> ModuleType:
    """The Python file at `path`, executed as the module `package.name` (e.g. a lab version of
    fused_gemm/kernels/matmul_tma.py as fused_gemm.kernels._lab)."""
    spec = importlib.util.spec_from_file_location(f"{package}.{name}", path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = package
    spec.loader.exec_module(module)
    return module


def load_package_copy(src: str, package: str, label: str) -> ModuleType:
    """The package `package` found under the directory `src` (e.g. `git archive` of an earlier
    commit), imported as `package_label` beside the installed one; its imports must be relative."""
    name = f"{package}_{label}"
    init = pathlib.Path(src) / package / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def gemm_operands(m: int, k: int, n: int):
    """bf16 on the GPU, as fused-gemm's launcher takes them: a (1, M, K); w (N, K), an nn.Linear
    weight scaled by 1/sqrt(K); b = w^T as a (1, K, N) view; bias (N,); outputs c and z (1, M, N)."""
    a = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(1, m, n, device="cuda", dtype=torch.bfloat16)
    return a, w, w.t().unsqueeze(0), bias, c, torch.empty_like(c)


def gemm_config_name(meta) -> str:
    """'BMxBN wW sS pP[s]' of a TMA-kernel config's meta-parameters (num_warps and num_stages
    included); the trailing s marks a split epilogue."""
    split = "s" if meta["EPILOGUE_SPLIT"] else ""
    return (f"{meta['BLOCK_M']}x{meta['BLOCK_N']} w{meta['num_warps']} s{meta['num_stages']}"
            f" p{meta['PROGRAMS_PER_SM']}{split}")  # fmt: skip


def step_ms(fn, steps: int = 6) -> float:
    """Median milliseconds of fn over `steps` calls after one, each call synchronized: a whole
    training or generation step."""
    import statistics
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def warm_training_step(point_text: str, provider: str, device: torch.device):
    """(step, model) of tritonformer.bench's training step for `provider` at "PRESET:CONTEXT:BATCH",
    warmed up twice (compiled, autotuned); model is our Transformer for provider "tritonformer"
    (None for the others, which build their own)."""
    from tritonformer.bench import ModelSlot, Point, model_kind, parse_value, point_config, training_step

    point = Point.parse(point_text)
    # LAB_SET="n_kv_head=4 ...": TransformerConfig overrides, as the bench's --set.
    overrides = {
        key: parse_value(value) for key, value in (item.split("=", 1) for item in os.environ.get("LAB_SET", "").split())
    }
    config = point_config(point, provider, overrides)
    model = ModelSlot().get(model_kind(provider), config, device) if provider == "tritonformer" else None
    step = training_step(point, provider, config, device, model=model)
    step.warm()
    step.warm()
    return step, model
