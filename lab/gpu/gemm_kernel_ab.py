"""A/B of two versions of fused-gemm's TMA kernel, config by config, in one process.

    python3 lab/gpu/gemm_kernel_ab.py OTHER_MATMUL_TMA_PY

OTHER_MATMUL_TMA_PY is another version of kernels/matmul_tma.py (e.g. the file at an earlier
commit). It is loaded as a module of the package, so its relative imports resolve. For each of
the issue's three products and each forward epilogue (plain; + bias; + bias, ReLU; + bias, GELU;
+ bias, GELU storing z), each of three configs runs pinned (the tuner is left out) with the
package's kernel (A) and with the other one (B). The two are timed together by the tuner's own
timer (ops.tuning.replay_rounds: CUDA-graph replays, interleaved rounds, the median).
A lab tool for the GPU runs recorded in NOTES.md: it prints a table and changes nothing.
"""

from __future__ import annotations

import statistics
import sys

import torch

from fused_gemm.kernels import matmul_tma
from fused_gemm.kernels.common import ACTIVATION_CODES
from fused_gemm.ops import launch, tuning
from lab import gemm_operands, load_module_as

PRODUCTS = [(16384, 2048, 8192), (16384, 8192, 2048), (16384, 2048, 6144)]
EPILOGUES = [("plain", False, None, False), ("+bias", True, None, False), ("+bias relu", True, "relu", False),
             ("+bias gelu", True, "gelu", False), ("+bias gelu, z", True, "gelu", True)]  # fmt: skip
# (BLOCK_M, BLOCK_N, num_warps, num_stages, PROGRAMS_PER_SM): the tuner's usual picks at these sizes.
CONFIGS = [(128, 128, 4, 3, 2), (128, 128, 8, 3, 2), (128, 256, 8, 3, 1)]


def _config(kernel, block_m, block_n, warps, stages, programs):
    for config in kernel.configs:
        kw = config.kwargs
        if (kw["BLOCK_M"], kw["BLOCK_N"], config.num_warps, config.num_stages, kw["PROGRAMS_PER_SM"]) == (
            block_m, block_n, warps, stages, programs,
        ):  # fmt: skip
            return config
    return None


def _pinned_launch(kernel, config, a, b, c, kwargs):
    """A launch of `kernel` with `config` alone: the plan re-resolves its one candidate (no timing)."""
    configs = [config]

    def call():
        launch._matmul_tma_kernel = kernel
        kernel.configs = configs
        launch.launch_matmul(a, b, c, **kwargs)

    return call


def main(other_path: str) -> None:
    ours = matmul_tma._matmul_tma_kernel
    other = load_module_as(other_path, "fused_gemm.kernels", "_other_matmul_tma")._matmul_tma_kernel
    all_ours, all_other = list(ours.configs), list(other.configs)
    print("| product | epilogue | config | A ms | B ms | B / A |")
    print("|---|---|---|---:|---:|---:|")
    for m, k, n in PRODUCTS:
        a, _, b, bias, c, z = gemm_operands(m, k, n)
        for label, has_bias, activation, store_z in EPILOGUES:
            kwargs = dict(bias=bias if has_bias else None, activation=ACTIVATION_CODES[activation],
                          z=z if store_z else None, split=1)  # fmt: skip
            launches, names = [], []
            for shape in CONFIGS:
                ours.configs, other.configs = all_ours, all_other
                config_a, config_b = _config(ours, *shape), _config(other, *shape)
                if config_a is None or config_b is None:
                    continue
                launch_a = _pinned_launch(ours, config_a, a, b, c, kwargs)
                launch_b = _pinned_launch(other, config_b, a, b, c, kwargs)
                launch_a()
                c_a = c.clone()
                c.fill_(float("nan"))
                launch_b()
                if not torch.allclose(c.float(), c_a.float(), rtol=2e-2, atol=2e-2):  # the same math, two kernels
                    print(f"B's output differs from A's: {m}x{k}x{n} {label} {shape}", flush=True)
                launches += [launch_a, launch_b]
                names.append("{}x{} w{} s{} p{}".format(*shape))
            samples = tuning.replay_rounds(launches, tuning.ROUNDS)
            ms = [statistics.median(times) for times in samples]
            for i, name in enumerate(names):
                t_a, t_b = ms[2 * i], ms[2 * i + 1]
                print(f"| {m}x{k}x{n} | {label} | {name} | {t_a:.4f} | {t_b:.4f} | {t_b / t_a:.3f} |", flush=True)
    launch._matmul_tma_kernel = ours
    ours.configs = all_ours


if __name__ == "__main__":
    main(sys.argv[1])
